// Host side of programmatic dependent launch (core/cuda/dependent_launch.cuh): whether the
// kernels written for it (the norms') are launched so. Off unless asked for: on an H200 it
// took op_bench layer_norm (bf16 [16384, 768], fwd+bwd, replayed from a CUDA Graph) from
// 68.3-68.5% to 72.8% of copy bandwidth, but one GPT-2 124M training step replayed from a graph
// took 31.1 ms with it against 30.5 ms without, in the same call: until the full step gains,
// the default stays the plain launch. MT_DEPENDENT_LAUNCH=1 in the environment turns it on at
// start; set_dependent_launch at any time (captures record the setting of their time).
#pragma once

namespace mt::cuda {

void set_dependent_launch(bool on);
bool dependent_launch_requested();
// Requested, and `device` is sm_90 or later (the first with griddepcontrol).
bool dependent_launch_enabled(int device);

}  // namespace mt::cuda
