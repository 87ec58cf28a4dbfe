"""Loaded at the start of every Python process of the run (PYTHONPATH): torch's DataLoader is
feedline's where users and tests import it (`from torch.utils.data import DataLoader`, or
`torch.utils.data.DataLoader`), before any test does, and in every process the tests start
(spawned workers and subprocess tests included). torch.utils.data.dataloader.DataLoader stays
torch's own: torch's classes there refer to it by that name (super(DataLoader, self))."""
import torch.utils.data

import feedline

torch.utils.data.DataLoader = feedline.DataLoader
