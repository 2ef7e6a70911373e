"""Test helpers shared by the parity tests against transformers (chapters "Today's block" and "Latent, sparse and sink
attention")."""

import torch


def float64_rms_norm_and_rotary(monkeypatch, norm_class, rotary_class) -> None:
    """transformers computes its RMSNorm and its rotary angles in float32 even for float64 weights
    (Llama's and DeepSeek-V3's, chapters "Today's block" and "Latent, sparse and sink attention"): patch ``forward`` of
    ``norm_class`` and ``rotary_class`` with the same functions in float64, for comparisons at 1e-10 and below."""

    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        d = 2 * self.inv_freq.shape[0]
        inv_freq = self.config.rope_parameters["rope_theta"] ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = position_ids[..., None].double() * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    monkeypatch.setattr(norm_class, "forward", rms_norm)
    monkeypatch.setattr(rotary_class, "forward", rotary)
