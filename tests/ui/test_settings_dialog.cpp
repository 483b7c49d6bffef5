// SettingsDialog: every field shows the given settings and edits map back onto ChatSettings.
#include <QtTest>
#include "common/test_suite.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QFileDialog>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTemporaryDir>

#include "common/scripted_server.h"
#include "ui/settings_dialog.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_settings_dialog {

using kvchat::app::ChatSettings;
using kvchat::app::ContextOverflowPolicy;
using kvchat::ui::SettingsDialog;

class SettingsDialogTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void unchanged_dialog_returns_the_same_settings();
  void edits_map_onto_the_settings();
  void model_field_browses_for_a_gguf_file_or_a_directory();
  void local_only_settings_are_greyed_out_for_a_server();
  void fetched_models_replace_one_the_server_lacks();
  void seeds_are_kept_within_the_signed_64_bit_range();
  void speculative_decoding_and_its_draft_model();
  void kv_cache_storage_choice();
};

namespace {
ChatSettings unusual_settings() {
  ChatSettings settings;
  settings.kv_cache_enabled = false;
  settings.temperature = 1.35;
  settings.top_k = 17;
  settings.top_p = 0.875;
  settings.min_p = 0.125;
  settings.repetition_penalty = 1.25;
  settings.seed = 9223372036854775783ull;
  settings.max_new_tokens = 333;
  settings.default_system_prompt = "Be brief.\nAnswer kindly.";
  settings.model_path = "/models/llama";
  settings.threads = 3;
  settings.context_limit = 1000;
  settings.long_context = true;
  settings.context_overflow = ContextOverflowPolicy::DropOldestTurns;
  settings.cache_budget_bytes = 123456789;  // not a whole number of MiB: kept exactly when untouched
  settings.speculative = kvchat::SpeculativeMode::DraftModel;
  settings.draft_model_path = "/models/llama-small.gguf";
  return settings;
}
}  // namespace

void SettingsDialogTest::unchanged_dialog_returns_the_same_settings() {
  const ChatSettings original = unusual_settings();
  SettingsDialog dialog(original);
  const ChatSettings shown = dialog.settings();
  QCOMPARE(shown.kv_cache_enabled, original.kv_cache_enabled);
  QCOMPARE(shown.temperature, original.temperature);
  QCOMPARE(shown.top_k, original.top_k);
  QCOMPARE(shown.top_p, original.top_p);
  QCOMPARE(shown.min_p, original.min_p);
  QCOMPARE(shown.repetition_penalty, original.repetition_penalty);
  QCOMPARE(shown.seed, original.seed);
  QCOMPARE(shown.max_new_tokens, original.max_new_tokens);
  QCOMPARE(shown.default_system_prompt, original.default_system_prompt);
  QCOMPARE(shown.model_path, original.model_path);
  QCOMPARE(shown.threads, original.threads);
  QCOMPARE(shown.context_limit, original.context_limit);
  QCOMPARE(shown.long_context, original.long_context);
  QCOMPARE(shown.context_overflow, original.context_overflow);
  QCOMPARE(shown.cache_budget_bytes, original.cache_budget_bytes);
  QCOMPARE(shown.speculative, original.speculative);
  QCOMPARE(shown.draft_model_path, original.draft_model_path);
}

void SettingsDialogTest::edits_map_onto_the_settings() {
  SettingsDialog dialog(unusual_settings());
  dialog.findChild<QCheckBox*>("kvCacheCheck")->setChecked(true);
  dialog.findChild<QDoubleSpinBox*>("temperatureSpin")->setValue(0.0);
  dialog.findChild<QSpinBox*>("topKSpin")->setValue(0);
  dialog.findChild<QLineEdit*>("seedEdit")->setText("42");
  dialog.findChild<QSpinBox*>("maxNewTokensSpin")->setValue(64);
  dialog.findChild<QPlainTextEdit*>("systemPromptEdit")->setPlainText("Tell stories.");
  dialog.findChild<QLineEdit*>("modelPathEdit")->setText("  ");
  dialog.findChild<QSpinBox*>("contextLimitSpin")->setValue(0);
  dialog.findChild<QCheckBox*>("longContextCheck")->setChecked(false);
  dialog.findChild<QComboBox*>("overflowCombo")->setCurrentIndex(0);
  dialog.findChild<QSpinBox*>("cacheBudgetSpin")->setValue(256);
  const ChatSettings edited = dialog.settings();
  QCOMPARE(edited.kv_cache_enabled, true);
  QCOMPARE(edited.temperature, 0.0);
  QCOMPARE(edited.top_k, 0);
  QCOMPARE(edited.seed, quint64(42));
  QCOMPARE(edited.max_new_tokens, 64);
  QCOMPARE(edited.default_system_prompt, QStringLiteral("Tell stories."));
  QCOMPARE(edited.model_path, QString());  // blank = the embedded model
  QCOMPARE(edited.context_limit, 0);
  QCOMPARE(edited.long_context, false);
  QCOMPARE(edited.context_overflow, ContextOverflowPolicy::Stop);
  QCOMPARE(edited.cache_budget_bytes, qint64(256) * 1024 * 1024);
  QCOMPARE(edited.top_p, 0.875);  // untouched fields stay
}

void SettingsDialogTest::model_field_browses_for_a_gguf_file_or_a_directory() {
  QTemporaryDir dir;
  const QString gguf = dir.filePath("tiny-Q8_0.gguf");
  {
    QFile file(gguf);
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.write("GGUF");
  }
  SettingsDialog dialog(unusual_settings());
  auto* field = dialog.findChild<QLineEdit*>("modelPathEdit");
  QVERIFY(field);

  // The file button: a picker filtered to GGUF files; the chosen file fills the field.
  auto* file_button = dialog.findChild<QPushButton*>("browseModelFileButton");
  QVERIFY(file_button);
  file_button->click();
  auto* file_picker = dialog.findChild<QFileDialog*>("modelFileDialog");
  QVERIFY(file_picker);
  QCOMPARE(file_picker->fileMode(), QFileDialog::ExistingFile);
  QCOMPARE(file_picker->nameFilters().first(), QStringLiteral("GGUF models (*.gguf)"));
  Q_EMIT file_picker->fileSelected(gguf);
  file_picker->close();
  QCOMPARE(field->text(), gguf);
  QCOMPARE(dialog.settings().model_path, gguf);

  // The folder button: a directory picker.
  auto* folder_button = dialog.findChild<QPushButton*>("browseModelDirectoryButton");
  QVERIFY(folder_button);
  folder_button->click();
  auto* folder_picker = dialog.findChild<QFileDialog*>("modelDirectoryDialog");
  QVERIFY(folder_picker);
  QCOMPARE(folder_picker->fileMode(), QFileDialog::Directory);
  QCOMPARE(QDir(folder_picker->directory()).absolutePath(), QDir(dir.path()).absolutePath());  // the file's folder
  Q_EMIT folder_picker->fileSelected(dir.path());
  folder_picker->close();
  QCOMPARE(dialog.settings().model_path, dir.path());
}

// KV cache, threads, the context limit and the rest of the engine's settings mean nothing to a server: greyed
// out while the backend is one, with a hint saying what is sent instead.
void SettingsDialogTest::local_only_settings_are_greyed_out_for_a_server() {
  SettingsDialog dialog(unusual_settings());
  auto* backend = dialog.findChild<QComboBox*>("backendCombo");
  auto* hint = dialog.findChild<QLabel*>("localOnlyHint");
  QVERIFY(hint);
  const QStringList local_only{"kvCacheCheck",          "threadsSpin",     "contextLimitSpin", "overflowCombo",
                               "longContextCheck",      "cacheBudgetSpin", "snapshotsCheck",   "snapshotBudgetSpin",
                               "snapshotDirectoryEdit", "modelPathEdit",   "speculativeCombo", "draftModelPathEdit",
                               "kvDtypeCombo"};
  const QStringList sent{"temperatureSpin",       "topKSpin", "topPSpin",         "minPSpin",
                         "repetitionPenaltySpin", "seedEdit", "maxNewTokensSpin", "systemPromptEdit"};
  auto enabled = [&](const QString& name) {
    auto* widget = dialog.findChild<QWidget*>(name);
    return widget && widget->isEnabled();
  };
  QCOMPARE(backend->currentIndex(), 0);
  for (const QString& name : local_only + sent) QVERIFY2(enabled(name), qPrintable(name));
  QVERIFY(hint->isHidden());

  backend->setCurrentIndex(1);
  for (const QString& name : local_only) QVERIFY2(!enabled(name), qPrintable(name));
  for (const QString& name : sent) QVERIFY2(enabled(name), qPrintable(name));
  QVERIFY(!hint->isHidden());
  QCOMPARE(hint->text(), QStringLiteral("On a server, the greyed-out settings do not apply: they are this computer's "
                                        "engine's. Temperature, top-p, top-k, min-p, the repetition penalty, the seed "
                                        "and max new tokens are sent with every request (README: Remote backend)."));
  QVERIFY(dialog.findChild<QSpinBox*>("topKSpin")->toolTip().contains("top_k"));

  backend->setCurrentIndex(0);
  for (const QString& name : local_only) QVERIFY2(enabled(name), qPrintable(name));
  QVERIFY(hint->isHidden());
}

// A model name from another server would be asked of this one on every turn: after Fetch models, a name the
// server does not list gives way to its first model, and the dialog says so.
void SettingsDialogTest::fetched_models_replace_one_the_server_lacks() {
  kvchat::test::ScriptedServer server;
  QVERIFY(server.start([](kvchat::test::ScriptedConnection& connection) {
    connection.send_head("200 OK", "Content-Type: application/json\r\n");
    connection.send(R"({"object":"list","data":[{"id":"alpha","object":"model"},{"id":"beta","object":"model"}]})");
  }));
  ChatSettings settings;
  settings.backend = kvchat::app::BackendKind::Remote;
  settings.remote_base_url = server.base_url();
  settings.remote_model = QStringLiteral("old-model");
  SettingsDialog dialog(settings);
  auto* models = dialog.findChild<QComboBox*>("remoteModelCombo");
  auto* status = dialog.findChild<QLabel*>("remoteStatusLabel");
  auto fetch = [&] {
    QSignalSpy fetched(&dialog, &SettingsDialog::modelsFetched);
    dialog.findChild<QPushButton*>("fetchModelsButton")->click();
    return fetched.wait(30000) && fetched.first().first().toInt() == 2;
  };
  QVERIFY(fetch());
  QCOMPARE(models->currentText(), QStringLiteral("alpha"));
  QCOMPARE(status->text(), QStringLiteral("2 models on the server. It has no \u201cold-model\u201d: its first model, "
                                          "\u201calpha\u201d, is chosen instead."));
  QCOMPARE(dialog.settings().remote_model, QStringLiteral("alpha"));

  // A model the server has stays chosen.
  models->setCurrentText(QStringLiteral("beta"));
  QVERIFY(fetch());
  QCOMPARE(models->currentText(), QStringLiteral("beta"));
  QCOMPARE(status->text(), QStringLiteral("2 models on the server"));
  QCOMPARE(dialog.settings().remote_model, QStringLiteral("beta"));
}

// vLLM refuses seeds above 2^63 - 1; the seed field takes up to 19 digits.
void SettingsDialogTest::seeds_are_kept_within_the_signed_64_bit_range() {
  SettingsDialog dialog(unusual_settings());
  dialog.findChild<QLineEdit*>("seedEdit")->setText("9999999999999999999");
  QCOMPARE(dialog.settings().seed, ChatSettings::kMaxSeed);
  dialog.findChild<QLineEdit*>("seedEdit")->setText("9223372036854775807");
  QCOMPARE(dialog.settings().seed, quint64(9223372036854775807ull));
}

// Off, prompt lookup or a draft model; the draft model's file is asked for only with that mode.
void SettingsDialogTest::speculative_decoding_and_its_draft_model() {
  ChatSettings original = unusual_settings();
  original.speculative = kvchat::SpeculativeMode::None;
  SettingsDialog dialog(original);
  auto* mode = dialog.findChild<QComboBox*>("speculativeCombo");
  auto* path = dialog.findChild<QLineEdit*>("draftModelPathEdit");
  QVERIFY(mode && path);
  QCOMPARE(mode->count(), 3);
  QCOMPARE(mode->currentIndex(), 0);
  QVERIFY(!path->isEnabled());
  mode->setCurrentIndex(1);
  QVERIFY(!path->isEnabled());
  QCOMPARE(dialog.settings().speculative, kvchat::SpeculativeMode::Lookup);
  mode->setCurrentIndex(2);
  QVERIFY(path->isEnabled());
  path->setText("  /models/draft.gguf ");
  const ChatSettings edited = dialog.settings();
  QCOMPARE(edited.speculative, kvchat::SpeculativeMode::DraftModel);
  QCOMPARE(edited.draft_model_path, QStringLiteral("/models/draft.gguf"));
}

// The KV cache's storage: four choices, the saved one shown, the chosen one returned.
void SettingsDialogTest::kv_cache_storage_choice() {
  ChatSettings original = unusual_settings();
  original.kv_dtype = kvchat::KvDtype::BF16;
  SettingsDialog dialog(original);
  auto* storage = dialog.findChild<QComboBox*>("kvDtypeCombo");
  QVERIFY(storage);
  QCOMPARE(storage->count(), 4);
  QCOMPARE(storage->currentData().toString(), QStringLiteral("bf16"));
  QCOMPARE(dialog.settings().kv_dtype, kvchat::KvDtype::BF16);
  storage->setCurrentIndex(storage->findData(QStringLiteral("q8_0")));
  QCOMPARE(dialog.settings().kv_dtype, kvchat::KvDtype::Q8_0);
  storage->setCurrentIndex(0);
  QCOMPARE(dialog.settings().kv_dtype, kvchat::KvDtype::F32);
}

KVCHAT_TEST_MAIN(SettingsDialogTest)

}  // namespace ui_test_settings_dialog

#include "test_settings_dialog.moc"
