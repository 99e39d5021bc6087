"""Picklable image transforms on CHW tensors, built on torch alone (no torchvision).

Photos packed with `--store original` come back in many sizes, and images of two sizes cannot
share a batch: a transform that makes one size is what lets `make_loader` stack them. A class
defined here, unlike a lambda or a function defined inside another, pickles by reference, so it
works with every DataLoader start method (fork, forkserver, spawn).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional


class RandomResizedCrop:
    """A random crop of `scale` of the image's area and aspect ratio within `ratio` (log-uniform),
    resized to `size` x `size` (or `size` = (H, W)), as torchvision's RandomResizedCrop draws it.
    Takes and returns a CHW tensor of the same dtype (uint8 stays uint8); draws from torch's
    generator, which DataLoader seeds in each worker."""

    def __init__(self, size: int | tuple[int, int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), tries: int = 10) -> None:
        self.size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if min(self.size) < 1:
            raise ValueError(f"RandomResizedCrop size must be at least 1 pixel, not {size}")
        if not (0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop needs 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1], "
                             f"not scale={scale}, ratio={ratio}")
        self.scale = scale
        self.ratio = ratio
        self.tries = tries

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop: `tries` draws, then the central crop of the
        ratio's nearest bound when none fits."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(self.tries):
            target = area * torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
            aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,)).item())
                left = int(torch.randint(0, width - w + 1, (1,)).item())
                return top, left, h, w
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            h, w = height, round(height * self.ratio[1])
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if not isinstance(image, torch.Tensor) or image.dim() != 3:
            raise TypeError(f"RandomResizedCrop takes a CHW tensor (open_dataset(..., decode=\"tensor\")), "
                            f"not {type(image).__name__}{tuple(getattr(image, 'shape', ()))}")
        top, left, h, w = self.box(image.shape[1], image.shape[2])
        crop = image[None, :, top:top + h, left:left + w].float()
        resized = functional.interpolate(crop, size=self.size, mode="bilinear", align_corners=False, antialias=True)[0]
        if image.dtype == torch.uint8:
            return resized.round_().clamp_(0, 255).to(torch.uint8)
        return resized.to(image.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio})"
