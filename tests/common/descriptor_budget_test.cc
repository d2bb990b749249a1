// The descriptor budget every listener keeps (common/descriptor_budget.h): the reserve below the
// open-file limit, the cap on connections, each listener's share, and draining a pending
// connection when no descriptor is left.
#include "common/descriptor_budget.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(DescriptorBudgetTest, RefusesInTheReserveAtTheCapAndPastTheShare) {
  const ListenerLimits limits{/*max_connections=*/50, /*reserved_descriptors=*/64,
                              /*descriptor_shares=*/2};
  // 256 descriptors: 192 above the reserve, 96 of them for this listener.
  EXPECT_EQ(RefuseConnection(100, 10, 256, limits), nullptr);
  EXPECT_EQ(std::string(RefuseConnection(192, 10, 256, limits)), "descriptors");
  EXPECT_EQ(std::string(RefuseConnection(100, 50, 256, limits)), "max_connections");
  const ListenerLimits many{1000, 64, 2};
  EXPECT_EQ(RefuseConnection(150, 95, 256, many), nullptr);
  EXPECT_EQ(std::string(RefuseConnection(150, 96, 256, many)), "descriptors");
}

TEST(DescriptorBudgetTest, DrainTakesAPendingConnectionOffTheQueue) {
  KeepSpareDescriptor();
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_TRUE(DrainPendingConnection(listener, &accept4));
  char byte;
  EXPECT_EQ(recv(client, &byte, 1, 0), 0) << "the drained connection is closed";
  close(client);
  close(listener);
  EXPECT_GT(OpenFileLimit(), 0);
}

}  // namespace
}  // namespace kiln
