// Encodes texts with transformers.js's tokenizers (@lenml/tokenizers, the library's tokenizer part): the
// independent encoding that make_family_fixtures.py records for each cut tokenizer.
// Reads {"tokenizer": ..., "tokenizer_config": ..., "texts": [...]} on stdin; writes [[ids...], ...].
// fetch_tokenizer_sources.sh installs the pinned package beside a copy of this file.
import { TokenizerLoader } from "@lenml/tokenizers";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const request = JSON.parse(input);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: request.tokenizer,
  tokenizerConfig: request.tokenizer_config,
});
process.stdout.write(JSON.stringify(request.texts.map((text) => Array.from(tokenizer.encode(text)))));
