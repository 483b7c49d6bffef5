#pragma once
// The libraries kvchat and kvchat-cli are built with, and their licences: the one table the About box is
// made from. tests/ui/test_about_licences.cpp checks it against the shared libraries the built programs
// load, so a library linked in without an entry here (or an entry for one no longer linked) fails the build's
// tests.
#include <QList>
#include <QString>
#include <QStringList>

namespace kvchat::app {

struct ThirdPartyLibrary {
  QString name;     // as the About box shows it
  QString licence;  // SPDX identifier
  // The shared objects that are this library, by the start of their file name ("libQt6Charts.so"); empty
  // for a header-only library, compiled into the programs.
  QStringList shared_objects;
  QString loaded_through;  // empty: a program links it itself; else what brings it in ("cpp-httplib")
};

const QList<ThirdPartyLibrary>& third_party_libraries();

// The About box's list: one line per library, "name — licence (through …)", HTML-escaped, joined by <br>.
QString third_party_licences_html();

}  // namespace kvchat::app
