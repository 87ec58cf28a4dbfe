// Iterates one epoch over the ImageFolder given on the command line and prints
// "images <N> batches <M>".
#include <feedline/feedline.h>

#include <cstdio>
#include <memory>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s IMAGE_FOLDER\n", argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<feedline::Loader>> loader = feedline::Loader::Create(
      feedline::LoaderOptions(argv[1]).batch_size(4).size(32).resize_size(36).workers(2));
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return 1;
  }
  long images = 0, batches = 0;
  for (absl::StatusOr<feedline::Batch>& batch : **loader) {
    if (!batch.ok()) {
      std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
      return 1;
    }
    images += long(batch->size());
    ++batches;
  }
  std::printf("images %ld batches %ld\n", images, batches);
  return 0;
}
