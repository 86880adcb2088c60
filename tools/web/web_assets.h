// The chat page's files (Vite bundle), embedded in the binary at build time.
//
//   if (const coli::web::WebAsset* a = coli::web::FindWebAsset("/")) {
//     res.set_content(std::string(a->bytes), std::string(a->content_type));
//   }
#ifndef COLI_TOOLS_WEB_WEB_ASSETS_H_
#define COLI_TOOLS_WEB_WEB_ASSETS_H_

#include <span>
#include <string_view>

namespace coli::web {

struct WebAsset {
  std::string_view path;          // "/index.html", "/assets/index-….js"
  std::string_view content_type;
  std::string_view bytes;
};

// Every embedded file (generated table).
std::span<const WebAsset> EmbeddedWebAssets();

// The asset for a request path ("/" and "" mean "/index.html"); nullptr when there is none.
const WebAsset* FindWebAsset(std::string_view path);

}  // namespace coli::web

#endif  // COLI_TOOLS_WEB_WEB_ASSETS_H_
