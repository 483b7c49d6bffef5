#pragma once
// Counting the tokens of a message being typed: the chat's template rendered over the whole prompt the next turn
// would send and encoded with the model's tokenizer. A DraftCounter lives on a thread of its own, so that
// counting never stalls the window and never waits behind a reply on the engine's thread.
#include <QMetaType>
#include <QObject>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/settings.h"
#include "engine/types.h"

namespace kvchat {
struct LoadedModel;
}

namespace kvchat::app {

// What sending a draft would give the model.
struct DraftMeasure {
  int draft_tokens = 0;   // the message alone
  int prompt_tokens = 0;  // the whole prompt the next turn would send (history + this message)
  int context_limit = 0;  // effective
  bool fits = true;       // false: the turn would be refused (see ChatTurnRunner's overflow rules)
};

struct DraftRequest {
  quint64 id = 0;
  std::shared_ptr<const kvchat::LoadedModel> model;  // read-only: its tokenizer and template
  std::vector<ChatMessage> messages;                 // the prompt, ending with the draft as the user's message
  int context_limit = 0;                             // effective
  ContextOverflowPolicy overflow = ContextOverflowPolicy::Stop;
};

// The count itself, on the calling thread. nullopt: the prompt cannot be encoded (logged).
std::optional<DraftMeasure> measure_draft(const DraftRequest& request);

class DraftCounter : public QObject {
  Q_OBJECT
 public:
  using QObject::QObject;
  // Requests older than `id` are skipped when their turn comes (the text has changed since). Any thread.
  void supersede(quint64 id) { latest_.store(id); }

 public Q_SLOTS:
  void count(const kvchat::app::DraftRequest& request);

 Q_SIGNALS:
  // `measured` false: the prompt could not be counted (see measure_draft).
  void counted(quint64 request_id, bool measured, const kvchat::app::DraftMeasure& measure);

 private:
  std::atomic<quint64> latest_{0};
};

}  // namespace kvchat::app

Q_DECLARE_METATYPE(kvchat::app::DraftMeasure)
Q_DECLARE_METATYPE(kvchat::app::DraftRequest)
