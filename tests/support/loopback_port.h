// A port on 127.0.0.1 that nothing listens on right now (bound to port 0, read back, released),
// for a server a test starts later or for a client that must find no one there.
#pragma once

namespace kiln::testing {

// 0 when no socket could be bound.
int UnusedLoopbackPort();

}  // namespace kiln::testing
