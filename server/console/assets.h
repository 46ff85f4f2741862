// The console's page, script, styles and Chart.js, embedded at build time
// (embed_assets.cmake) so that the binary serves them itself and nothing
// loads from another origin.
#ifndef IDEM_SERVER_CONSOLE_ASSETS_H_
#define IDEM_SERVER_CONSOLE_ASSETS_H_

#include <cstddef>
#include <string>

namespace idem::console {

struct Asset {
  const char* path;  // "/app.js"
  const unsigned char* data;
  size_t size;
};

// The asset served at `path`, or null.
const Asset* FindAsset(const std::string& path);

}  // namespace idem::console

#endif  // IDEM_SERVER_CONSOLE_ASSETS_H_
