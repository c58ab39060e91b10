// Reference token ids for test_hf_tokenizer: runs Hugging Face's own JavaScript tokenizer.json reader
// (npm @huggingface/tokenizers, unpacked by scripts/get_data.sh --tokenizer into data/tokenizers-js)
// on each string of a JSON array, without adding special tokens around it (add_special_tokens false,
// as picotrain's encode).
//
//   node test/hf_reference.js TOKENIZERS_JS_DIR TOKENIZER_JSON INPUT.json  ->  stdout: [[ids...], ...]
//
// TOKENIZER_JSON's folder may hold a tokenizer_config.json, which is read too.
'use strict';
const fs = require('fs');
const path = require('path');

const [lib, file, input] = process.argv.slice(2);
if (!lib || !file || !input) {
  console.error('usage: node hf_reference.js TOKENIZERS_JS_DIR TOKENIZER_JSON INPUT.json');
  process.exit(2);
}
const cjs = path.resolve(lib, 'dist', 'tokenizers.cjs');
if (!fs.existsSync(cjs)) {
  console.error(`${cjs} is missing: run scripts/get_data.sh --tokenizer`);
  process.exit(3);
}
const { Tokenizer } = require(cjs);
const configPath = path.join(path.dirname(file), 'tokenizer_config.json');
const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, 'utf8')) : {};
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(file, 'utf8')), config);
const texts = JSON.parse(fs.readFileSync(input, 'utf8'));
process.stdout.write(JSON.stringify(texts.map((t) => tokenizer.encode(t, { add_special_tokens: false }).ids)));
