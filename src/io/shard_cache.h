// Remote WebDataset shards (http(s):// and s3:// URLs) through the on-disk shard cache.
//
// The first time a shard URL is opened it is downloaded whole (streamed to disk, up to 4 at a
// time, a stalled transfer failing after the read timeout) into the cache folder
// ($FEEDLINE_CACHE_DIR, else $XDG_CACHE_HOME/feedline or ~/.cache/feedline; "shards/<hash of
// the URL>-<name>"), and its catalog is written beside it ("<file>.idx", a few bytes per
// member): the URL (as shown), the object's validator, its size, each member's offset, size,
// .cls label and content hash, and a checksum of the catalog (io/tar_dataset.h).
//
// Budget. The cache keeps at most a byte budget of shard files ($FEEDLINE_SHARD_CACHE_BYTES:
// bytes, or with a K/M/G/T suffix; default half the free space of its file system when the data
// set is opened, plus what the cache already holds). Downloads hold it as they complete: the
// least recently used files of other data sets are removed first, then a download that still
// does not fit is not kept (its catalog is): the disk holds at most the budget plus the
// downloads in flight. A shard whose file is not in the cache is read member by member with
// HTTP range requests, from its catalog; with a budget of 0 nothing but catalogs is kept; when a
// later open finds room in the budget again, such a shard is downloaded again (in the data
// set's order, as long as it fits). Only files feedline made are counted or removed.
//
// Verified before and while used. At open, an entry whose catalog does not read (cut, changed,
// of an older version: its checksum), describes another URL, or whose copy has another size
// than catalogued (a crash that lost a file's tail, a full disk) is fetched again; so is a
// shard whose validator changed on the server (one HEAD each; without a validator, its length).
// A file at a shard's name without a catalog is never adopted (a file someone planted there, or
// an older cut download). Every member read is checked against its content hash: a cached copy
// that differs is removed and its samples read by range; a range read that differs (a shard
// rewritten on a server that sends no validator) is a DataError naming it, and its catalog is
// removed so that the next open fetches it again. Range reads also ask for the catalogued
// version (If-Match, or If-Unmodified-Since): HTTP 412 is a DataError naming the shard. A
// server that does not answer leaves the cache as it is: a cached data set opens offline.
//
// Downloads are written under names of their own ("<file>.<random>.part", created as mkstemp
// does) and renamed when complete; a copy that is not a tar is not kept. The processes of a node
// that share the cache folder (a job's ranks, or several jobs) download each shard once: a shard
// is fetched under a lock of its own ("<file>.lock", flock: dropped by the kernel when its
// holder dies); a process finding it taken fetches its other shards first, then waits and finds
// the shard done. A part file whose lock is free was left by a process that died: the next open
// removes it. The budget is the folder's, so per node when the folder is. The folder must be
// the user's own and not writable by others (core/file_io.h EnsurePrivateDir).
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
