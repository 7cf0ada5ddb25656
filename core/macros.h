// Portability macros shared by host-only C++ and CUDA translation units.
#pragma once

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#define MT_DEVICE __device__
#else
#define MT_HOST_DEVICE
#define MT_DEVICE
#endif

#define MT_CONCAT_IMPL(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_IMPL(a, b)
