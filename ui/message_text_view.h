#pragma once
// A read-only view of untrusted message text (the user's and the model's words): Markdown with raw HTML shown
// as text, or plain text. It never loads a resource the text names (no image, no file, no remote URL), wraps
// long words anywhere instead of widening the transcript, and is exactly as tall as its text (the transcript
// scrolls, not the view). In code mode it is monospace, does not wrap, and scrolls sideways inside itself.
// A web link shows its address on hover (the tooltip) and opens only after a question naming it.
#include <QTextBrowser>

namespace kvchat::ui {

class MessageTextView : public QTextBrowser {
  Q_OBJECT
 public:
  enum class Mode { Prose, Code };
  explicit MessageTextView(Mode mode, QWidget* parent = nullptr);

  void setMarkdownSource(const QString& markdown);  // prose: single line breaks kept as hard breaks
  void setPlainSource(const QString& text);
  QString source() const { return source_; }  // as given, before rendering
  Mode mode() const { return mode_; }
  // A code view's font: the system's fixed-pitch family only, so the size follows the transcript's.
  static QFont codeFontFamily();

  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void resizeEvent(QResizeEvent* event) override;
  void changeEvent(QEvent* event) override;  // a new text size (View > Larger text) changes the height
  QVariant loadResource(int type, const QUrl& name) override;

 private:
  void fit_height();
  // A web link clicked: asks (a window-modal "openLinkDialog" naming the address), then opens the browser;
  // when none starts, says so ("openLinkFailedDialog") and copies the address. Other schemes are ignored.
  void ask_to_open_link(const QUrl& url);
  Mode mode_;
  QString source_;
};

}  // namespace kvchat::ui
