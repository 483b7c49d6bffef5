// llama_cpp_logits: llama.cpp's own logits for a GGUF file and a list of token ids, as an independent reference
// for the family fixtures (tests/fixtures/families/<family>/logits-*-llama.cpp.f32).
//
// Usage: llama_cpp_logits MODEL.gguf ID,ID,... OUT.f32
//        llama_cpp_logits --tokenize MODEL.gguf TEXT_FILE   (prints the ids "ID,ID,...": llama.cpp's tokenization of
//        the file's text with the special tokens it adds and the added tokens in the text parsed, as llama-cli does)
// Evaluates the ids exactly as given (no BOS) as one batch, logits at every position, and writes them as raw
// float32 [positions, n_vocab], row-major. Prints the model's architecture and the largest |logit|.
// Settings, fixed for determinism: CPU only, 1 thread, F32 KV cache, no flash attention, n_ctx 512,
// n_batch = n_ubatch = 512.
//
// Built and run by tests/reference/llama_cpp_logits.sh against a llama.cpp build; not part of the product build.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

static int tokenize(const char* model_path, const char* text_path) {
  std::ifstream in(text_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mparams = llama_model_default_params();
  mparams.vocab_only = true;
  llama_model* model = llama_model_load_from_file(model_path, mparams);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", model_path);
    return 1;
  }
  std::vector<llama_token> ids(text.size() + 16);
  const int n = llama_tokenize(llama_model_get_vocab(model), text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), /*add_special=*/true,
                               /*parse_special=*/true);
  if (n < 0) {
    std::fprintf(stderr, "llama_tokenize failed\n");
    return 1;
  }
  for (int i = 0; i < n; ++i) std::printf(i ? ",%d" : "%d", ids[i]);
  std::printf("\n");
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--tokenize") return tokenize(argv[2], argv[3]);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf ID,ID,... OUT.f32\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  std::stringstream list(argv[2]);
  for (std::string item; std::getline(list, item, ',');) ids.push_back(std::stoi(item));
  const int n = static_cast<int>(ids.size());
  const int n_ctx = 512;
  if (n == 0 || n > n_ctx) {
    std::fprintf(stderr, "need 1 to %d token ids, got %d\n", n_ctx, n);
    return 2;
  }

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();

  llama_model_params mparams = llama_model_default_params();
  mparams.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mparams);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }

  llama_context_params cparams = llama_context_default_params();
  cparams.n_ctx = n_ctx;
  cparams.n_batch = cparams.n_ubatch = n_ctx;
  cparams.n_seq_max = 1;
  cparams.n_threads = cparams.n_threads_batch = 1;
  cparams.type_k = cparams.type_v = GGML_TYPE_F32;
  cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cparams.offload_kqv = false;
  cparams.op_offload = false;
  llama_context* ctx = llama_init_from_model(model, cparams);
  if (!ctx) {
    std::fprintf(stderr, "cannot create a context\n");
    return 1;
  }

  llama_batch batch = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n;
  if (llama_decode(ctx, batch) != 0) {
    std::fprintf(stderr, "llama_decode failed\n");
    return 1;
  }

  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<float> logits(static_cast<size_t>(n) * n_vocab);
  float largest = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    for (int j = 0; j < n_vocab; ++j) {
      logits[static_cast<size_t>(i) * n_vocab + j] = row[j];
      largest = std::fmax(largest, std::fabs(row[j]));
    }
  }
  FILE* out = std::fopen(argv[3], "wb");
  if (!out || std::fwrite(logits.data(), sizeof(float), logits.size(), out) != logits.size() || std::fclose(out)) {
    std::fprintf(stderr, "cannot write %s\n", argv[3]);
    return 1;
  }

  char arch[64] = "?";
  llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
  std::printf("%s: %s, %d positions x %d logits, max |logit| %.6f\n", argv[1], arch, n, n_vocab, largest);

  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
