#pragma once
// Client libraries an application talks to `kvchat-cli serve` with, pinned npm packages installed once per build
// folder so later runs need no registry: the official `openai` SDK, the Vercel AI SDK (`ai` with its
// OpenAI-compatible provider), LangChain's OpenAI chat model, and zod for their schemas.

#include <QString>

#include <utility>
#include <vector>

#include "common/openai_npm_package.h"
#include "common/test_paths.h"

namespace kvchat::test {

// name, version
inline const std::vector<std::pair<QString, QString>>& npm_client_packages() {
  static const std::vector<std::pair<QString, QString>> packages = {{"openai", "7.60.0"},
                                                                    {"ai", "7.0.185"},
                                                                    {"@ai-sdk/openai-compatible", "3.0.97"},
                                                                    {"zod", "4.6.7"},
                                                                    {"@langchain/openai", "1.6.0"},
                                                                    {"@langchain/core", "1.4.0"}};
  return packages;
}

inline QString npm_clients_dir() { return QString::fromStdString(build_dir()) + "/npm-agent-clients"; }

// Installs the packages into npm_clients_dir() unless each is there at its version (install_npm_packages).
inline QString install_npm_clients() { return install_npm_packages(npm_clients_dir(), npm_client_packages()); }

}  // namespace kvchat::test
