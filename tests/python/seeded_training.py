"""A training script as users write one: torch.manual_seed, random torchvision augmentations in
the dataset, a small model trained for two epochs. Prints a digest of the trained weights.

    /usr/bin/python3 seeded_training.py {torch|feedline} NUM_WORKERS [EXECUTOR]
"""
import hashlib
import sys

import torch
import torch.utils.data as tud
import torchvision.transforms as T


class Images(tud.Dataset):
    """64 fixed 3x40x40 images, augmented at random each time they are read."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(64, 3, 40, 40, generator=g)
        self.augment = T.Compose([T.RandomResizedCrop(32, antialias=True),
                                  T.RandomHorizontalFlip(),
                                  T.ColorJitter(brightness=0.4, contrast=0.4)])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.augment(self.images[i]), i % 10


def main():
    which, num_workers = sys.argv[1], int(sys.argv[2])
    executor = sys.argv[3] if len(sys.argv) > 3 else "auto"
    torch.manual_seed(42)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if which == "torch":
        loader = tud.DataLoader(Images(), batch_size=8, shuffle=True, num_workers=num_workers)
    else:
        import feedline
        loader = feedline.DataLoader(Images(), batch_size=8, shuffle=True,
                                     num_workers=num_workers, executor=executor)
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print(h.hexdigest())


if __name__ == "__main__":
    main()
