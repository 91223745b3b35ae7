"""SyncBatchNorm: batch normalization whose statistics cover the batch of every rank.

Forward allgathers each rank's (count, mean, M2) and merges them with Chan's parallel formula
(numerically stable, and ranks may hold different batch sizes). Backward allreduces the two sums the
input gradient needs; weight and bias gradients stay local, as in torch's SyncBatchNorm, and are
averaged by DistributedOptimizer like any other gradient.
"""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from nezha.basics import size
from nezha.ops import Sum
from nezha.torch import mpi_ops
from nezha.torch.autograd_ops import _waited


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d (input (N, C, ...)) synchronised over all ranks."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or size() == 1:
            return super().forward(input)

        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        weight = self.weight if self.affine else None
        bias = self.bias if self.affine else None
        running = (self.running_mean, self.running_var) if self.track_running_stats else None
        return _SyncBatchNormFn.apply(input, weight, bias, running, self.eps, momentum)


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running, eps, momentum):
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        # Element-wise work in at least float32; the per-channel statistics are merged in float64.
        acc = torch.promote_types(input.dtype, torch.float32)
        x = input.detach().to(acc)
        count = input.numel() // channels
        mean = x.mean(dims) if count else torch.zeros(channels, dtype=acc, device=x.device)
        m2 = ((x - _expand(mean, x)) ** 2).sum(dims)
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device),
                           mean.to(torch.float64), m2.to(torch.float64)]).reshape(1, -1)
        gathered = _waited(mpi_ops.allgather_async, local.cpu())
        counts, means, m2s = (gathered[:, 0:1], gathered[:, 1:1 + channels],
                              gathered[:, 1 + channels:])
        total = counts.sum()
        if total <= 1:
            raise ValueError("SyncBatchNorm needs more than one value per channel over all ranks")
        global_mean = (counts * means).sum(0) / total
        global_m2 = (m2s + counts * (means - global_mean) ** 2).sum(0)
        var = global_m2 / total
        global_mean, var = global_mean.to(input.device), var.to(input.device)
        invstd = torch.rsqrt(var + eps).to(acc)

        if running is not None:
            running_mean, running_var = running
            unbiased = var * (total / (total - 1))
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        xhat = (x - _expand(global_mean.to(acc), x)) * _expand(invstd, x)
        out = xhat
        if weight is not None:
            out = out * _expand(weight.detach().to(acc), x) + _expand(bias.detach().to(acc), x)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total = float(total)
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        xhat, invstd, weight = ctx.saved_tensors
        dims = [0] + list(range(2, grad_output.dim()))
        acc = invstd.dtype
        dy = grad_output.to(acc)
        xh = xhat.to(acc)
        local_sum_dy = dy.sum(dims)
        local_sum_dy_xhat = (dy * xh).sum(dims)
        sums = torch.cat([local_sum_dy, local_sum_dy_xhat]).to(torch.float64).cpu()
        sums = _waited(mpi_ops.allreduce_async, sums, op=Sum).to(dy.device, acc)
        channels = xhat.shape[1]
        mean_dy, mean_dy_xhat = sums[:channels] / ctx.total, sums[channels:] / ctx.total
        scale = invstd if weight is None else invstd * weight.detach().to(acc)
        grad_input = (dy - _expand(mean_dy, dy) - xh * _expand(mean_dy_xhat, dy)) * _expand(scale, dy)
        grad_weight = local_sum_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = local_sum_dy.to(weight.dtype) if weight is not None else None
        return grad_input.to(grad_output.dtype), grad_weight, grad_bias, None, None, None


def _expand(per_channel, like):
    """Shapes a (C,) vector to broadcast against an (N, C, ...) tensor."""
    return per_channel.reshape([1, -1] + [1] * (like.dim() - 2))


__all__ = ["SyncBatchNorm"]
