// As main.cc, through the LibTorch adapter: prints "images <N> batches <M> shape <B>x3x32x32".
#include <feedline/torch.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s IMAGE_FOLDER\n", argv[0]);
    return 2;
  }
  try {
    auto loader = feedline::torch::make_data_loader(
        argv[1], feedline::LoaderOptions().batch_size(4).size(32).resize_size(36).workers(2));
    long images = 0, batches = 0, first = 0;
    for (auto& batch : *loader) {
      if (batches == 0) first = long(batch.data.size(0));
      if (batch.data.dim() != 4 || batch.data.size(1) != 3 ||
          batch.target.numel() != batch.data.size(0)) {
        std::fprintf(stderr, "unexpected tensor shapes\n");
        return 1;
      }
      images += long(batch.data.size(0));
      ++batches;
    }
    std::printf("images %ld batches %ld shape %ldx3x32x32\n", images, batches, first);
  } catch (const feedline::Error& e) {
    std::fprintf(stderr, "feedline::Error: %s\n", e.what());
    return 1;
  }
  return 0;
}
