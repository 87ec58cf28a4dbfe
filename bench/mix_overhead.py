"""A mixture of one source at weight 1.0 (feedline.Mix) against that source alone: images/s,
the two interleaved round by round (the order swapped every round), no epoch head start (a
loader's head start would decode beside the other contender).

    PYTHONPATH=build/python /usr/bin/python3 bench/mix_overhead.py build/bench/data/imagenet-like-v1 6

(feedline-bench makes the bundled data set on its first run.)"""
import sys
import time

import feedline


def rate(loader, epochs=3):
    images = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, _ in loader:
            images += x.shape[0]
    return images / (time.perf_counter() - t0)


def main():
    data = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    kw = dict(batch_size=256, size=224, transform="train", seed=0, epoch_head_start=False)
    alone = feedline.ImageLoader(data, **kw)
    mixed = feedline.ImageLoader(feedline.Mix([(data, 1.0)]), **kw)
    ra, rm = [], []
    for r in range(rounds):
        if r % 2 == 0:
            ra.append(rate(alone))
            rm.append(rate(mixed))
        else:
            rm.append(rate(mixed))
            ra.append(rate(alone))
        print(f"round {r}: alone {ra[-1]:.0f} img/s, mix {rm[-1]:.0f} img/s, "
              f"ratio {rm[-1] / ra[-1]:.3f}", flush=True)
    print(f"mix / alone: {sum(rm) / sum(ra):.3f} (over {rounds} rounds)")


if __name__ == "__main__":
    main()
