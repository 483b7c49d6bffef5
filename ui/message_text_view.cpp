#include "ui/message_text_view.h"

#include <spdlog/spdlog.h>

#include <QApplication>
#include <QClipboard>
#include <QCursor>
#include <QDesktopServices>
#include <QFontDatabase>
#include <QMessageBox>
#include <QResizeEvent>
#include <QScrollBar>
#include <QTextBlock>
#include <QTextCursor>
#include <QTextDocument>
#include <QToolTip>

#include <cmath>

#include "ui/markdown_blocks.h"

namespace kvchat::ui {

namespace {

// QTextDocument::loadResource reads any local file an <img> or ![](...) names once its parent's loader
// returns nothing, so the document itself must refuse: message text never reaches the disk or the network.
class NoResourceDocument : public QTextDocument {
 public:
  using QTextDocument::QTextDocument;

 protected:
  QVariant loadResource(int type, const QUrl& name) override {
    spdlog::debug("message text names a resource ({}, type {}): not loaded", name.toString().toStdString(), type);
    return QVariant();
  }
};

// Qt's image handler falls back to reading a plain path itself (QImage::load) when the document gives no
// data, so images never reach the layout: each one is replaced by a note naming what was not loaded.
void replace_images_with_text(QTextDocument* document) {
  struct Image {
    int position;
    int length;
    QString name;
  };
  QList<Image> images;
  for (QTextBlock block = document->begin(); block != document->end(); block = block.next())
    for (auto it = block.begin(); !it.atEnd(); ++it) {
      const QTextFragment fragment = it.fragment();
      if (fragment.charFormat().isImageFormat())
        images.push_back({fragment.position(), fragment.length(), fragment.charFormat().toImageFormat().name()});
    }
  for (auto it = images.crbegin(); it != images.crend(); ++it) {
    QTextCursor cursor(document);
    cursor.setPosition(it->position);
    cursor.setPosition(it->position + it->length, QTextCursor::KeepAnchor);
    QTextCharFormat note;
    note.setFontItalic(true);
    cursor.insertText(QObject::tr("[image not loaded: %1]").arg(it->name), note);
  }
}

// Plain-text features only: raw HTML blocks and spans are shown as the characters they are.
const QTextDocument::MarkdownFeatures kMarkdownFeatures(QTextDocument::MarkdownDialectGitHub |
                                                        QTextDocument::MarkdownNoHTML);

}  // namespace

MessageTextView::MessageTextView(Mode mode, QWidget* parent) : QTextBrowser(parent), mode_(mode) {
  setDocument(new NoResourceDocument(this));
  document()->setDocumentMargin(mode == Mode::Code ? 6 : 0);
  setFrameShape(QFrame::NoFrame);
  setReadOnly(true);
  setOpenLinks(false);  // a click on a web link asks, then opens the browser (below); nothing else is followed
  // The text is the model's: a link's words may say anything, so the address itself is shown on hover and
  // in the question before anything opens.
  connect(this, &QTextBrowser::highlighted, this, [this](const QUrl& url) {
    setToolTip(url.isEmpty() ? QString() : url.toString(QUrl::FullyEncoded));
    if (!url.isEmpty()) QToolTip::showText(QCursor::pos(), toolTip(), this);
  });
  connect(this, &QTextBrowser::anchorClicked, this, &MessageTextView::ask_to_open_link);
  // Selectable by mouse, but not a Tab stop: the transcript would otherwise hold dozens of them.
  setFocusPolicy(Qt::ClickFocus);
  setTextInteractionFlags(Qt::TextSelectableByMouse | Qt::TextSelectableByKeyboard | Qt::LinksAccessibleByMouse);
  setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
  viewport()->setAutoFillBackground(false);
  if (mode == Mode::Code) {
    setFont(codeFontFamily());
    setLineWrapMode(QTextEdit::NoWrap);
    setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  } else {
    setAutoFillBackground(false);
    setStyleSheet(QStringLiteral("QTextBrowser { background: transparent; }"));
    setLineWrapMode(QTextEdit::WidgetWidth);
    setWordWrapMode(QTextOption::WrapAtWordBoundaryOrAnywhere);
    setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  }
}

QFont MessageTextView::codeFontFamily() {
  // The family only: the size follows the transcript's (View > Larger text) like the prose around it.
  const QFont fixed = QFontDatabase::systemFont(QFontDatabase::FixedFont);
  QFont family;
  family.setFamilies(fixed.families().isEmpty() ? QStringList{fixed.family()} : fixed.families());
  family.setStyleHint(QFont::Monospace);
  family.setFixedPitch(true);
  return family;
}

void MessageTextView::setMarkdownSource(const QString& markdown) {
  if (markdown == source_ && !document()->isEmpty()) return;
  source_ = markdown;
  document()->setMarkdown(with_hard_line_breaks(markdown), kMarkdownFeatures);
  replace_images_with_text(document());
  fit_height();
}

void MessageTextView::setPlainSource(const QString& text) {
  if (text == source_ && !document()->isEmpty()) return;
  source_ = text;
  document()->setPlainText(text);
  if (mode_ == Mode::Code) document()->setDefaultFont(font());
  fit_height();
}

QSize MessageTextView::sizeHint() const { return {minimumSizeHint().width(), height()}; }

QSize MessageTextView::minimumSizeHint() const {
  // Narrow on purpose: the text wraps (prose) or scrolls (code) to whatever width the bubble gets.
  return {fontMetrics().averageCharWidth() * 8, height()};
}

void MessageTextView::resizeEvent(QResizeEvent* event) {
  QTextBrowser::resizeEvent(event);
  if (event->oldSize().width() != event->size().width()) fit_height();
}

void MessageTextView::ask_to_open_link(const QUrl& url) {
  const QString address = url.toString(QUrl::FullyEncoded);
  if (url.scheme() != QLatin1String("https") && url.scheme() != QLatin1String("http")) {
    spdlog::info("a link in a message is not a web address ({}): not opened", address.toStdString());
    return;
  }
  QWidget* parent = window();
  auto* question = new QMessageBox(QMessageBox::Question, tr("Open link"),
                                   tr("Open this address in the web browser?\n\n%1").arg(address),
                                   QMessageBox::Open | QMessageBox::Cancel, parent);
  question->setObjectName("openLinkDialog");
  question->setDefaultButton(QMessageBox::Cancel);
  question->setAttribute(Qt::WA_DeleteOnClose);
  connect(question, &QMessageBox::finished, parent, [parent, url, address](int result) {
    if (result != QMessageBox::Open) return;
    if (QDesktopServices::openUrl(url)) return;
    // No browser (or none that started): the address goes to the clipboard so it can be pasted into one.
    spdlog::warn("opening {} failed: no web browser started", address.toStdString());
    QApplication::clipboard()->setText(address);
    auto* failure = new QMessageBox(QMessageBox::Warning, tr("Link not opened"),
                                    tr("No web browser could be started for\n%1\n\nThe address is copied to the "
                                       "clipboard.")
                                        .arg(address),
                                    QMessageBox::Ok, parent);
    failure->setObjectName("openLinkFailedDialog");
    failure->setAttribute(Qt::WA_DeleteOnClose);
    failure->open();
  });
  question->open();
}

void MessageTextView::changeEvent(QEvent* event) {
  QTextBrowser::changeEvent(event);
  if (event->type() != QEvent::FontChange) return;
  if (mode_ == Mode::Code) document()->setDefaultFont(font());
  fit_height();
}

QVariant MessageTextView::loadResource(int type, const QUrl& name) {
  (void)type;
  (void)name;
  return QVariant();
}

void MessageTextView::fit_height() {
  if (mode_ == Mode::Prose) document()->setTextWidth(viewport()->width());
  int height = static_cast<int>(std::ceil(document()->size().height())) + 2 * frameWidth();
  if (mode_ == Mode::Code && document()->idealWidth() > viewport()->width())
    height += horizontalScrollBar()->sizeHint().height();
  if (height != this->height() || minimumHeight() != height) setFixedHeight(height);
}

}  // namespace kvchat::ui
