// Serves the web page's static files on kilnd's HTTP listener: "/" is the page, "/web/..." its
// script, styles and chart library. They are open (no token): they hold no data, and the page
// asks for a token before it calls the /api routes, which do need one.
#pragma once

#include "server/http/http_server.h"

namespace kiln::web {

void AddWebPageRoutes(http::HttpServer* server);

}  // namespace kiln::web
