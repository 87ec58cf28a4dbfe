// Remote WebDataset shards (http(s):// and s3:// URLs) through the on-disk shard cache.
//
// The first time a shard URL is opened it is downloaded whole (streamed to disk, up to 4 at a
// time, a stalled transfer failing after the read timeout) into the cache folder
// ($FEEDLINE_CACHE_DIR, else $XDG_CACHE_HOME/feedline or ~/.cache/feedline; "shards/<hash of
// the URL>-<name>"), and its catalog — members, offsets and .cls labels — is written beside it
// ("<file>.idx", a few bytes per member). The cache keeps at most a byte budget of shard files
// ($FEEDLINE_SHARD_CACHE_BYTES: bytes, or with a K/M/G/T suffix; default half the free space of
// its file system when the data set is opened, plus what the cache already holds): past it,
// the least recently used shard files are removed (the ones of the data set being opened are
// the most recent), their catalogs stay. A shard whose file is not in the cache is read member
// by member with HTTP range requests, from its catalog: no second download, and with a budget
// of 0 nothing but catalogs is kept; when a later open finds room in the budget again, such a
// shard is downloaded again (in the data set's order, as long as it fits). Whole local copies
// are read at local-disk speed; range reads cost a request per sample (the loader keeps
// io_depth of them in flight).
//
// Downloads are written under names of their own ("<file>.<random>.part") and renamed when
// complete; a copy that is not a tar is not kept. The processes of a node that share the cache
// folder (a job's ranks, or several jobs) download each shard once: a shard is fetched under a
// lock of its own ("<file>.lock", flock: dropped by the kernel when its holder dies); a process
// finding it taken fetches its other shards first, then waits and finds the shard done. A part
// file whose lock is free was left by a process that died: the next open removes it. The budget
// is the folder's, so per node when the folder is.
//
// A catalog keeps the object's ETag. At open, each catalogued shard's ETag is asked for (HEAD):
// a shard changed on the server is fetched again (a server that does not answer leaves the
// cache as it is: a cached data set opens offline). While reading, range reads ask for the
// catalogued version (If-Match), so a shard rewritten meanwhile is a DataError naming it (HTTP
// 412), never bytes read at stale offsets.
#ifndef FEEDLINE_SRC_IO_SHARD_CACHE_H_
#define FEEDLINE_SRC_IO_SHARD_CACHE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/http.h"
#include "io/tar_dataset.h"

namespace feedline {

std::string ShardCacheDir();

// The cache's byte budget ($FEEDLINE_SHARD_CACHE_BYTES, or the default above); -1 if the
// variable is malformed (an error for the caller to report).
int64_t ShardCacheBudget(const std::string& dir);

// Where each shard of `urls` is read from (a cached file, or by range with its catalog),
// downloading and cataloguing the shards seen for the first time, then holding the budget.
absl::StatusOr<std::vector<ShardSource>> PrepareRemoteShards(const std::vector<std::string>& urls,
                                                             const HttpOptions& options);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_SHARD_CACHE_H_
