#include "process_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench_util.h"

extern char** environ;

namespace feedline::bench {
namespace {

// The parent of `pid` from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces
// and parentheses, so the fields are taken after the last ')'); -1 if it is gone.
pid_t ParentOf(const char* pid) {
  char path[300];  // "/proc/" + a d_name (at most 255 bytes) + "/stat"
  std::snprintf(path, sizeof(path), "/proc/%s/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (close_paren == nullptr) return -1;
  char state = 0;
  int ppid = -1;
  if (std::sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2) return -1;
  return ppid;
}

// `root` and its live descendants.
std::vector<pid_t> ProcessTree(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  if (DIR* dir = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
      const pid_t ppid = ParentOf(e->d_name);
      if (ppid > 0) children.emplace(ppid, pid_t(std::atoi(e->d_name)));
    }
    ::closedir(dir);
  }
  std::vector<pid_t> tree = {root};
  for (size_t i = 0; i < tree.size(); ++i) {
    auto [first, last] = children.equal_range(tree[i]);
    for (auto it = first; it != last; ++it) tree.push_back(it->second);
  }
  return tree;
}

// The "<key>: <n> kB" figures of a /proc status-like file, in bytes (-1 when absent).
std::map<std::string, int64_t> KilobyteFields(const std::string& path,
                                              const std::vector<std::string>& keys) {
  std::map<std::string, int64_t> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    for (const std::string& key : keys) {
      if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 &&
          line[key.size()] == ':') {
        std::istringstream fields(line.substr(key.size() + 1));
        int64_t kb = 0;
        if (fields >> kb) out[key] = kb * 1024;
      }
    }
  }
  return out;
}

// Shared-memory objects (the kernel's shmem: memfds, POSIX and System V shared memory, shared
// anonymous mappings) by the path /proc shows for them.
bool IsSharedObjectPath(absl::string_view path) {
  for (absl::string_view prefix : {"/memfd:", "/dev/shm/", "/SYSV", "/dev/zero"}) {
    if (absl::StartsWith(path, prefix)) return true;
  }
  return false;
}

// Adds to `objects` ((device, inode) -> bytes allocated) each shared-memory object `pid` maps
// or holds open; false (and nothing added) when one could not be measured.
bool AddSharedObjects(pid_t pid, std::map<std::pair<dev_t, ino_t>, int64_t>* objects) {
  std::vector<std::string> paths;
  {
    std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
    if (!maps) return false;
    std::string line;
    while (std::getline(maps, line)) {
      // "start-end perms offset dev inode path"
      std::istringstream in(line);
      std::string range, perms, offset, dev, inode;
      in >> range >> perms >> offset >> dev >> inode;
      std::string path;
      std::getline(in >> std::ws, path);
      if (!perms.empty() && perms.back() == 's' && IsSharedObjectPath(path)) {
        paths.push_back(absl::StrCat("/proc/", pid, "/map_files/", range));
      }
    }
  }
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = ::opendir(fd_dir.c_str());
  if (dir == nullptr) return false;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = absl::StrCat(fd_dir, "/", e->d_name);
    char target[512];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n > 0 && IsSharedObjectPath(absl::string_view(target, size_t(n)))) paths.push_back(path);
  }
  ::closedir(dir);
  std::map<std::pair<dev_t, ino_t>, int64_t> found;
  for (const std::string& path : paths) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return false;
    found[{st.st_dev, st.st_ino}] = int64_t(st.st_blocks) * 512;
  }
  objects->insert(found.begin(), found.end());
  return true;
}

}  // namespace

int64_t TreePss(const std::vector<pid_t>& pids) {
  int64_t total = 0;
  std::map<std::pair<dev_t, ino_t>, int64_t> objects;
  for (pid_t pid : pids) {
    std::map<std::string, int64_t> f =
        KilobyteFields(absl::StrCat("/proc/", pid, "/smaps_rollup"), {"Pss", "Pss_Shmem"});
    if (f.count("Pss") == 0) continue;  // gone
    total += f["Pss"];
    if (AddSharedObjects(pid, &objects)) total -= f["Pss_Shmem"];
  }
  for (const auto& [key, bytes] : objects) total += bytes;
  return total;
}

void SampleTreeMemory(pid_t root, bool read_pss, TreeMemory* memory) {
  const std::vector<pid_t> tree = ProcessTree(root);
  int64_t rss_sum = 0;
  int alive = 0;
  for (pid_t pid : tree) {
    std::map<std::string, int64_t> f =
        KilobyteFields(absl::StrCat("/proc/", pid, "/status"), {"VmRSS", "VmHWM"});
    if (f.count("VmRSS") == 0) continue;  // gone, or a zombie
    ++alive;
    rss_sum += f["VmRSS"];
    memory->max_hwm_bytes = std::max(memory->max_hwm_bytes, f["VmHWM"]);
  }
  ++memory->samples;
  memory->max_processes = std::max(memory->max_processes, alive);
  if (rss_sum > memory->peak_rss_sum_bytes) {
    memory->peak_rss_sum_bytes = rss_sum;
    if (read_pss) {
      memory->pss_near_peak_bytes = TreePss(tree);
    }
  }
}

absl::StatusOr<ChildRun> RunChild(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env,
                                  std::chrono::milliseconds interval) {
  if (argv.empty()) return absl::InvalidArgumentError("RunChild: no program");
  // The environment: ours, with `env`'s entries replacing those of the same name.
  std::vector<std::string> environment = env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry = *e;
    const absl::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& mine : env) {
      replaced = replaced || absl::string_view(mine).substr(0, mine.find('=')) == name;
    }
    if (!replaced) environment.emplace_back(entry);
  }
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  const Clock::time_point start = Clock::now();
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot run ", argv[0]));
  }

  // The sampler owns `memory` until it is joined; `done` is what the threads share.
  TreeMemory memory;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread sampler([&] {
    // PSS costs milliseconds per process to read: at most twice a second.
    Clock::time_point last_pss = Clock::now() - std::chrono::seconds(1);
    std::unique_lock<std::mutex> lock(mu);
    while (!done) {
      lock.unlock();
      const bool read_pss = Clock::now() - last_pss >= std::chrono::milliseconds(500);
      const int64_t before = memory.pss_near_peak_bytes;
      SampleTreeMemory(pid, read_pss, &memory);
      if (memory.pss_near_peak_bytes != before) last_pss = Clock::now();
      lock.lock();
      cv.wait_for(lock, interval, [&] { return done; });
    }
  });

  ChildRun run;
  std::string pending;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, size_t(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      run.stdout_lines.push_back(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) run.stdout_lines.push_back(pending);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  sampler.join();
  run.memory = memory;
  run.seconds = SecondsSince(start);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace feedline::bench
