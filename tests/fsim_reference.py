"""FSIM and FSIMc written out from the paper, for tests: numpy only, no piq, nothing of fl_attack.

Zhang, Zhang, Mou & Zhang, "FSIM: A Feature Similarity Index for Image Quality Assessment", IEEE TIP
20(8), 2011: eqs. 1-8 (phase congruency PC by Kovesi's method with log-Gabor filters, the Scharr
gradient magnitude GM, their similarities S_PC and S_G, pooled with PC_m = max(PC1, PC2)), and the
authors' FeatureSIM.m with its phasecong2 (4 scales, 4 orientations, shortest wavelength 6, scale
factor 2, sigma_f 0.55, angular spread ratio 1.2, noise k = 2, T1 = 0.85, T2 = 160, T3 = T4 = 200,
lambda = 0.03). Images are 0..255 grayscale (H, W) or RGB (H, W, 3); no downsampling (the paper's
factor max(1, round(min(H, W)/256)) is 1 below 384 pixels).
"""

from __future__ import annotations

import numpy as np


def _grid(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """The frequency coordinates of FeatureSIM.m: (x, y) in cycles/pixel, centred."""

    def axis(n):
        return np.arange(-(n - 1) / 2, (n - 1) / 2 + 1) / (n - 1) if n % 2 else np.arange(-n / 2, n / 2) / n

    return np.meshgrid(axis(cols), axis(rows))


def phase_congruency(image: np.ndarray) -> np.ndarray:
    """Kovesi's phase congruency (phasecong2 as FeatureSIM.m calls it), (H, W) float64 in [0, 1]."""
    nscale, norient, min_wavelength, mult, sigma_onf, d_theta_on_sigma, k, eps = 4, 4, 6, 2, 0.55, 1.2, 2.0, 1e-4
    theta_sigma = np.pi / norient / d_theta_on_sigma
    rows, cols = image.shape
    image_fft = np.fft.fft2(image)
    x, y = _grid(rows, cols)
    radius = np.fft.ifftshift(np.sqrt(x**2 + y**2))
    theta = np.fft.ifftshift(np.arctan2(-y, x))
    radius[0, 0] = 1.0
    lowpass = np.fft.ifftshift(1.0 / (1.0 + (np.sqrt(x**2 + y**2) / 0.45) ** (2 * 15)))
    log_gabor = []
    for s in range(nscale):
        fo = 1.0 / (min_wavelength * mult**s)
        g = np.exp(-(np.log(radius / fo) ** 2) / (2 * np.log(sigma_onf) ** 2)) * lowpass
        g[0, 0] = 0.0
        log_gabor.append(g)
    energy_all = np.zeros((rows, cols))
    an_all = np.zeros((rows, cols))
    for o in range(norient):
        angle = o * np.pi / norient
        ds = np.sin(theta) * np.cos(angle) - np.cos(theta) * np.sin(angle)
        dc = np.cos(theta) * np.cos(angle) + np.sin(theta) * np.sin(angle)
        spread = np.exp(-(np.abs(np.arctan2(ds, dc)) ** 2) / (2 * theta_sigma**2))
        sum_e, sum_o, sum_an = np.zeros((rows, cols)), np.zeros((rows, cols)), np.zeros((rows, cols))
        responses, ifft_filters = [], []
        for s in range(nscale):
            filt = log_gabor[s] * spread
            ifft_filters.append(np.real(np.fft.ifft2(filt)) * np.sqrt(rows * cols))
            eo = np.fft.ifft2(image_fft * filt)
            responses.append(eo)
            sum_an += np.abs(eo)
            sum_e += np.real(eo)
            sum_o += np.imag(eo)
            if s == 0:
                em_n = np.sum(filt**2)
        x_energy = np.sqrt(sum_e**2 + sum_o**2) + eps
        mean_e, mean_o = sum_e / x_energy, sum_o / x_energy
        energy = np.zeros((rows, cols))
        for eo in responses:
            e, od = np.real(eo), np.imag(eo)
            energy += e * mean_e + od * mean_o - np.abs(e * mean_o - od * mean_e)
        median_e2n = np.median(np.abs(responses[0]).ravel() ** 2)
        noise_power = (-median_e2n / np.log(0.5)) / em_n
        est_sum_an2 = sum(f**2 for f in ifft_filters)
        est_sum_ai_aj = sum(ifft_filters[i] * ifft_filters[j] for i in range(nscale) for j in range(i + 1, nscale))
        noise_energy2 = 2 * noise_power * np.sum(est_sum_an2) + 4 * noise_power * np.sum(est_sum_ai_aj)
        tau = np.sqrt(noise_energy2 / 2)
        threshold = (tau * np.sqrt(np.pi / 2) + k * np.sqrt((2 - np.pi / 2) * tau**2)) / 1.7
        energy_all += np.maximum(energy - threshold, 0.0)
        an_all += sum_an
    return energy_all / an_all


def gradient_magnitude(image: np.ndarray) -> np.ndarray:
    """The Scharr gradient magnitude of FeatureSIM.m (conv2 'same': zero padding), (H, W)."""
    dx = np.array([[3, 0, -3], [10, 0, -10], [3, 0, -3]]) / 16.0
    dy = dx.T
    padded = np.pad(image, 1)
    rows, cols = image.shape

    def convolve(kernel):  # conv2 flips the kernel; the magnitude does not see the sign
        flipped = kernel[::-1, ::-1]
        out = np.zeros((rows, cols))
        for i in range(3):
            for j in range(3):
                out += flipped[i, j] * padded[i : i + rows, j : j + cols]
        return out

    return np.sqrt(convolve(dx) ** 2 + convolve(dy) ** 2)


def fsim_reference(reference: np.ndarray, distorted: np.ndarray) -> float:
    """FSIM (grayscale (H, W)) or FSIMc (RGB (H, W, 3)) of two 0..255 images (eqs. 5-8)."""
    reference, distorted = reference.astype(np.float64), distorted.astype(np.float64)
    colour = reference.ndim == 3
    if colour:
        to_yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
        y1, i1, q1 = np.moveaxis(reference @ to_yiq.T, -1, 0)
        y2, i2, q2 = np.moveaxis(distorted @ to_yiq.T, -1, 0)
    else:
        y1, y2 = reference, distorted
    pc1, pc2 = phase_congruency(y1), phase_congruency(y2)
    g1, g2 = gradient_magnitude(y1), gradient_magnitude(y2)
    s_pc = (2 * pc1 * pc2 + 0.85) / (pc1**2 + pc2**2 + 0.85)
    s_g = (2 * g1 * g2 + 160) / (g1**2 + g2**2 + 160)
    pc_m = np.maximum(pc1, pc2)
    similarity = s_pc * s_g
    if colour:
        s_i = (2 * i1 * i2 + 200) / (i1**2 + i2**2 + 200)
        s_q = (2 * q1 * q2 + 200) / (q1**2 + q2**2 + 200)
        similarity = similarity * np.real(np.power((s_i * s_q).astype(complex), 0.03))
    return float(np.sum(similarity * pc_m) / np.sum(pc_m))
