"""The PI-SME paper's published figures the experiments compare with, in one torch-free place (read by
analysis.experiments and the docs tables, which must import without torch)."""

from __future__ import annotations

PAPER_PSNR = {  # Table 1 of the paper (dB), 1000 iterations on a GPU; no FEMNIST rows for GI-NAS and DGGI
    ("cifar100", 100): {"ig": 15.01, "ginas": 16.00, "dggi": 19.93, "sme": 21.88, "nlsme": 25.77, "pisme": 26.52},
    ("cifar100", 250): {"ig": 12.28, "ginas": 12.70, "dggi": 18.60, "sme": 18.26, "nlsme": 20.29, "pisme": 23.20},
    ("femnist", 100): {"ig": 17.09, "sme": 22.27, "nlsme": 24.06, "pisme": 25.34},
    ("femnist", 250): {"ig": 13.64, "sme": 21.35, "nlsme": 23.14, "pisme": 24.37},
}
PAPER_OTHER = {("cifar100", 100, "pisme"): {"ssim": 0.868, "lpips": 0.149}}  # Table 1's SSIM and LPIPS
PAPER_MARGIN = {100: 0.8, 10: 4.2}  # PI-SME - NL-SME (dB) by classes C: Fig. 2's, from its text
