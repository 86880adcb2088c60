#include "tools/web/web_assets.h"

namespace coli::web {

const WebAsset* FindWebAsset(std::string_view path) {
  if (path.empty() || path == "/") path = "/index.html";
  for (const WebAsset& asset : EmbeddedWebAssets()) {
    if (asset.path == path) return &asset;
  }
  return nullptr;
}

}  // namespace coli::web
