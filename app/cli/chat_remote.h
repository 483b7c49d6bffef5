#pragma once
// kvchat-cli chat --backend URL: the turns of a stored conversation answered by an OpenAI-compatible server.
#include <string>

#include "app/remote/remote_client.h"
#include "app/store/conversation_store.h"
#include "engine/types.h"

namespace kvchat::cli {

// The endpoint from --backend, --api-key (else $KVCHAT_API_KEY) and --remote-model (else the server's first
// model, asked now: an unreachable server or a refused key fails here, before anything is stored).
app::RemoteEndpoint remote_endpoint_from_options(const std::string& base_url, const std::string& api_key_option,
                                                 const std::string& model_option);

// One turn: store the user message, stream the server's reply to stdout, store it with the server's figures
// and which server and model answered. False when the turn failed or broke off (partial text kept, marked).
bool run_remote_turn(app::ConversationStore& store, qint64 conversation_id, const app::RemoteEndpoint& endpoint,
                     const GenerationConfig& generation, const std::string& text);

}  // namespace kvchat::cli
