"""silero-vad's network as a plain PyTorch module, for any device.

The silero-vad package ships its 16 kHz model as TorchScript (``load_silero_vad(onnx=False)``);
its stateless core ``_model`` maps ``(x [B, 576], state [2, B, 128]) -> (p [B, 1], state)``. That
core is re-stated here in a few lines with the package's own weights, so it runs on CUDA with
hundreds of lanes per call and its inputs and outputs stay on the device:

    x -> reflect-pad 64 on the right -> STFT as a conv (258 basis rows, 256 taps, hop 128)
      -> magnitude of the 129 bins -> 4 x (conv3 + ReLU; strides 1, 2, 2, 1) -> LSTM cell (128)
      -> ReLU -> 1x1 conv -> sigmoid

``tests/test_vad.py`` checks it against the TorchScript model on the same inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD_RIGHT = 64  # samples, silero's reflection padding before its STFT
HOP = 128  # samples, silero's STFT hop
CONV_STRIDES = (1, 2, 2, 1)


class SileroNet(torch.nn.Module):
    """silero-vad 6's 16 kHz core with its own weights; ``forward(x, state) -> (p, state)``."""

    def __init__(self, jit_core):
        super().__init__()
        sd = {k: v.detach().clone().float() for k, v in jit_core.state_dict().items()}
        self.register_buffer("basis", sd["stft.forward_basis_buffer"])  # [258, 1, 256]
        self.conv_w = torch.nn.ParameterList(
            [torch.nn.Parameter(sd[f"encoder.{i}.reparam_conv.weight"], requires_grad=False) for i in range(4)])
        self.conv_b = torch.nn.ParameterList(
            [torch.nn.Parameter(sd[f"encoder.{i}.reparam_conv.bias"], requires_grad=False) for i in range(4)])
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            self.register_buffer(name, sd[f"decoder.rnn.{name}"])
        self.register_buffer("out_w", sd["decoder.decoder.2.weight"])  # [1, 128, 1]
        self.register_buffer("out_b", sd["decoder.decoder.2.bias"])

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, 576] float32 (64 samples of context + a 512-sample window); state [2, B, 128]."""
        x = F.pad(x[:, None], (0, PAD_RIGHT), mode="reflect")
        spec = F.conv1d(x, self.basis, stride=HOP)  # [B, 258, 4]
        bins = spec.shape[1] // 2
        h = torch.sqrt(spec[:, :bins] ** 2 + spec[:, bins:] ** 2)
        for w, b, stride in zip(self.conv_w, self.conv_b, CONV_STRIDES):
            h = F.relu(F.conv1d(h, w, b, stride=stride, padding=1))
        hx, cx = torch.lstm_cell(h.squeeze(-1), (state[0], state[1]), self.weight_ih, self.weight_hh,
                                 self.bias_ih, self.bias_hh)
        p = torch.sigmoid(F.conv1d(F.relu(hx)[:, :, None], self.out_w, self.out_b))  # [B, 1, 1]
        return p[:, :, 0], torch.stack([hx, cx])
