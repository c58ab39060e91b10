#!/usr/bin/env bash
# docs/configuration.md is what `picotrain keys --markdown` prints, byte for byte: the reference's
# one source is the key table in the binary (core/config/config_keys.cpp and
# core/config/config_reference_text.cpp), and this fails when the file was edited by hand or a key
# changed without regenerating it. Usage: config_reference_doc.sh PICOTRAIN SOURCE_DIR
set -euo pipefail
picotrain=$1
doc=$2/docs/configuration.md
printed=$(mktemp)
trap 'rm -f "$printed"' EXIT
"$picotrain" keys --markdown >"$printed"
if ! diff -u --label docs/configuration.md --label "picotrain keys --markdown" "$doc" "$printed"; then
  echo "docs/configuration.md differs from what \`picotrain keys --markdown\` prints (diff above)." >&2
  echo "Edit the text in core/config/config_reference_text.cpp (not the file), rebuild, and regenerate it:" >&2
  echo "  build/picotrain keys --markdown > docs/configuration.md" >&2
  exit 1
fi
echo "docs/configuration.md is what picotrain keys --markdown prints"
