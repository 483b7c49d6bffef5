#pragma once
// Where the embedded stories260K model is: next to the executable, in the installed share folder, or in
// the source tree (a build that was never installed), in that order.
#include <QString>

namespace kvchat::app {

// The first of the candidate folders that holds a config.json; the source-tree path when none does
// (loading it then fails with a message that names it).
QString embedded_model_directory();

// `configured` (a model directory or a .gguf file) when it is not empty, else the embedded model.
QString resolve_model_path(const QString& configured);

}  // namespace kvchat::app
