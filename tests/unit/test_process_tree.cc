// The benchmarks' memory measure (bench/process_tree.h: TreePss) on a process tree made here:
// a shared-memory object mapped by two processes counts once, and one that a process holds open
// but no process maps (torch's batch between its worker and the loop) counts whole.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "process_tree.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

void* MapWritten(int fd, size_t bytes, char fill) {
  REQUIRE(ftruncate(fd, off_t(bytes)) == 0);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(m != MAP_FAILED);
  std::memset(m, fill, bytes);
  return m;
}

}  // namespace

TEST_CASE("TreePss counts a shared-memory object once and one held unmapped whole", "[bench]") {
  const int64_t base = feedline::bench::TreePss({getpid()});
  const int shared = memfd_create("test-shared", 0);
  REQUIRE(shared >= 0);
  void* mapped = MapWritten(shared, 16 * kMiB, 'x');  // mapped here and in the child
  int ready[2], done[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(done) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // only system calls here
    const int held = memfd_create("test-held", 0);
    void* h = held >= 0 ? MapWritten(held, 32 * kMiB, 'y') : nullptr;
    if (h != nullptr) munmap(h, 32 * kMiB);  // written, then mapped by no process
    volatile char sum = 0;  // the inherited mapping's pages in the child's page table too
    for (size_t o = 0; o < 16 * kMiB; o += 4096) sum = char(sum + static_cast<char*>(mapped)[o]);
    char c = held >= 0 ? '1' : '0';
    if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) _exit(2);
    _exit(0);
  }
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  const double grew = double(feedline::bench::TreePss({getpid(), pid}) - base) / double(kMiB);
  REQUIRE(write(done[1], &c, 1) == 1);
  int status = 0;
  waitpid(pid, &status, 0);
  munmap(mapped, 16 * kMiB);
  for (int fd : {shared, ready[0], ready[1], done[0], done[1]}) close(fd);
  REQUIRE(c == '1');
  INFO(grew << " MiB for 16 MiB mapped by two processes and 32 MiB held open");
  CHECK(grew > 44);
  CHECK(grew < 56);
}
