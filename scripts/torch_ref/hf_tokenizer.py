"""The reader of a Hugging Face folder's tokenizer files (tokenizer.json, special_tokens_map.json,
generation_config.json), written by `picotrain convert --format hf`: checked to agree with the
folder's config.json, and an encoder of its own for byte-level BPE (added tokens, Split and
ByteLevel pre-tokenizers, BPE by merge rank), written from Hugging Face's documentation rather
than from picotrain's C++ so that the two can be compared (test_checkpoint_tokenizer).

    python3 scripts/torch_ref/hf_tokenizer.py FOLDER INPUT.json  ->  stdout: [[ids...], ...]
"""
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: the package's parent on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from torch_ref import BadInput
else:
    from . import BadInput

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_chars():
    """GPT-2's bytes_to_unicode: the character that spells each byte in the vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput("cannot read %s: %s" % (path, e))


class Tokenizer:
    """A byte-level BPE tokenizer.json; encode() gives the ids without special tokens around them."""

    def __init__(self, path):
        try:
            import regex  # \p{L} and \p{N}, which the pre-tokenizers' patterns use and `re` lacks
        except ImportError:
            raise BadInput("encoding %s needs the Python package regex (pip install regex)" % path)
        j = read_json(path)
        model = j.get("model") or {}
        if model.get("type") != "BPE":
            raise BadInput("%s: model type %r is not BPE" % (path, model.get("type")))
        self.vocab = model["vocab"]
        self.ranks = {}
        for m in model["merges"]:
            pair = tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
            self.ranks.setdefault(pair, len(self.ranks))
        self.ignore_merges = model.get("ignore_merges", False)
        self.added = {t["content"]: t["id"] for t in j.get("added_tokens", [])}
        self.added_pattern = regex.compile("|".join(regex.escape(t) for t in sorted(self.added, key=len, reverse=True))) \
            if self.added else None
        pre = j.get("pre_tokenizer") or {}
        self.stages = []  # (compiled pattern, keep matches, keep gaps)
        for p in pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]:
            if p["type"] == "Split":
                pat = p["pattern"]
                text = pat["Regex"] if "Regex" in pat else regex.escape(pat["String"])
                isolated = p["behavior"] == "Isolated"
                if p["behavior"] not in ("Isolated", "Removed"):
                    raise BadInput("%s: Split behavior %r is not read here" % (path, p["behavior"]))
                keep_matches, keep_gaps = (True, True) if isolated else (p.get("invert", False), not p.get("invert", False))
                self.stages.append((regex.compile(text), keep_matches, keep_gaps))
            elif p["type"] == "ByteLevel":
                if p.get("use_regex", True):
                    self.stages.append((regex.compile(GPT2_PATTERN), True, True))
            else:
                raise BadInput("%s: pre-tokenizer %r is not byte-level BPE" % (path, p["type"]))
        self.chars = byte_chars()

    def split(self, pieces, stage):
        pattern, keep_matches, keep_gaps = stage
        out = []
        for piece in pieces:
            at = 0
            for m in pattern.finditer(piece):
                if m.start() == m.end():
                    continue
                if keep_gaps and m.start() > at:
                    out.append(piece[at:m.start()])
                if keep_matches:
                    out.append(m.group())
                at = m.end()
            if keep_gaps and at < len(piece):
                out.append(piece[at:])
        return out

    def bpe(self, piece):
        word = "".join(self.chars[b] for b in piece.encode("utf-8"))
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [(self.ranks.get((a, b), None), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
            ranked = [(r, i) for r, i in ranked if r is not None]
            if not ranked:
                break
            best = min(ranked)[0]
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and self.ranks.get((symbols[i], symbols[i + 1])) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return [self.vocab[s] for s in symbols]

    def encode(self, text):
        ids, at = [], 0
        matches = list(self.added_pattern.finditer(text)) if self.added_pattern else []
        for m in matches + [None]:
            end = m.start() if m else len(text)
            pieces = [text[at:end]] if end > at else []
            for stage in self.stages:
                pieces = self.split(pieces, stage)
            for piece in pieces:
                ids += self.bpe(piece)
            if m:
                ids.append(self.added[m.group()])
                at = m.end()
        return ids


def check_hf_tokenizer(path, config):
    """False when the folder has no tokenizer.json; else True once its ids are checked to fit
    config.json's vocab_size, and its special_tokens_map.json, generation_config.json and
    config.json to name the same bos/eos ids (raises BadInput otherwise)."""
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        return False
    j = read_json(os.path.join(path, "tokenizer.json"))
    added = {t["content"]: t["id"] for t in j.get("added_tokens", [])}
    ids = list(j["model"]["vocab"].values()) + list(added.values())
    if max(ids) >= config["vocab_size"]:
        raise BadInput("%s: tokenizer.json has ids up to %d, config.json's vocab_size is %d" %
                       (path, max(ids), config["vocab_size"]))
    special = read_json(os.path.join(path, "special_tokens_map.json"))
    generation = read_json(os.path.join(path, "generation_config.json"))
    for key in ("bos", "eos"):
        text = special.get(key + "_token")
        want = added.get(text) if text is not None else None
        got = (generation.get(key + "_token_id"), config.get(key + "_token_id"))
        if got != (want, want):
            raise BadInput("%s: %s_token %r is id %r, but generation_config.json and config.json say %r" %
                           (path, key, text, want, got))
    return True


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        if not check_hf_tokenizer(sys.argv[1], read_json(os.path.join(sys.argv[1], "config.json"))):
            raise BadInput("%s has no tokenizer.json" % sys.argv[1])
        folder_tokenizer = Tokenizer(os.path.join(sys.argv[1], "tokenizer.json"))
    except BadInput as e:
        print("hf_tokenizer: %s" % e, file=sys.stderr)
        sys.exit(2)
    print(json.dumps([folder_tokenizer.encode(t) for t in read_json(sys.argv[2])]))
