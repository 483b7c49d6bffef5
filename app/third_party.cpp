#include "app/third_party.h"

namespace kvchat::app {

const QList<ThirdPartyLibrary>& third_party_libraries() {
  // Debian's packages: Qt Charts is GPL-3 there (no LGPL option), so the desktop program as a whole is
  // distributed under the GPL-3's terms; the command-line program does not link it.
  static const QList<ThirdPartyLibrary> libraries{
      {QStringLiteral("Qt 6 (Core, Gui, Widgets, Sql)"),
       QStringLiteral("LGPL-3.0-only"),
       {QStringLiteral("libQt6Core.so"), QStringLiteral("libQt6Gui.so"), QStringLiteral("libQt6Widgets.so"),
        QStringLiteral("libQt6Sql.so")},
       QString()},
      {QStringLiteral("Qt Charts"), QStringLiteral("GPL-3.0-only"), {QStringLiteral("libQt6Charts.so")}, QString()},
      {QStringLiteral("LibTorch"),
       QStringLiteral("BSD-3-Clause"),
       {QStringLiteral("libtorch.so"), QStringLiteral("libtorch_cpu.so"), QStringLiteral("libc10.so")},
       QString()},
      {QStringLiteral("OpenBLAS"),
       QStringLiteral("BSD-3-Clause"),
       {QStringLiteral("libblas.so")},
       QStringLiteral("LibTorch")},
      {QStringLiteral("spdlog"), QStringLiteral("MIT"), {QStringLiteral("libspdlog.so")}, QString()},
      {QStringLiteral("fmt"), QStringLiteral("MIT"), {QStringLiteral("libfmt.so")}, QString()},
      {QStringLiteral("nlohmann/json"), QStringLiteral("MIT"), {}, QString()},
      {QStringLiteral("cpp-httplib"), QStringLiteral("MIT"), {QStringLiteral("libcpp-httplib.so")}, QString()},
      {QStringLiteral("OpenSSL"),
       QStringLiteral("Apache-2.0"),
       {QStringLiteral("libssl.so"), QStringLiteral("libcrypto.so")},
       QStringLiteral("cpp-httplib")},
      {QStringLiteral("xxHash"), QStringLiteral("BSD-2-Clause"), {QStringLiteral("libxxhash.so")}, QString()},
      {QStringLiteral("PCRE2"),
       QStringLiteral("BSD-3-Clause WITH PCRE2-exception"),
       {QStringLiteral("libpcre2-8.so")},
       QString()},
      {QStringLiteral("ICU"),
       QStringLiteral("Unicode-DFS-2016"),
       {QStringLiteral("libicuuc.so"), QStringLiteral("libicudata.so")},
       QString()},
      {QStringLiteral("SQLite"),
       QStringLiteral("public domain"),
       {QStringLiteral("libsqlite3.so")},
       QStringLiteral("Qt's SQLite driver")},
      {QStringLiteral("GNU C library"),
       QStringLiteral("LGPL-2.1-or-later"),
       {QStringLiteral("libc.so"), QStringLiteral("libm.so"), QStringLiteral("ld-linux")},
       QString()},
      {QStringLiteral("GCC runtime (libstdc++, libgcc)"),
       QStringLiteral("GPL-3.0-or-later WITH GCC-exception-3.1"),
       {QStringLiteral("libstdc++.so"), QStringLiteral("libgcc_s.so")},
       QString()},
  };
  return libraries;
}

QString third_party_licences_html() {
  QStringList lines;
  for (const ThirdPartyLibrary& library : third_party_libraries()) {
    QString line = QStringLiteral("%1 \u2014 %2").arg(library.name, library.licence);
    if (!library.loaded_through.isEmpty()) line += QStringLiteral(" (through %1)").arg(library.loaded_through);
    lines << line.toHtmlEscaped();
  }
  return lines.join(QStringLiteral("<br>"));
}

}  // namespace kvchat::app
