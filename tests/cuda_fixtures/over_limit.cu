// Planted for tests/test_check_cuda_resources.py: a kernel that compiles everywhere but cannot launch. It keeps
// 96 floats live across a loop (about 100 registers per thread) and is launched with 1,024 threads:
// ~100 x 1,024 > the 65,536 registers a block may hold. tools/check_cuda_resources.py must fail on it.
constexpr int kWide = 96;
constexpr int kBigBlock = 1024;

__global__ void heavy_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  float acc[kWide];
#pragma unroll
  for (int i = 0; i < kWide; ++i) acc[i] = in[(threadIdx.x * kWide + i) % n];
  for (int step = 0; step < n; ++step) {
#pragma unroll
    for (int i = 0; i < kWide; ++i) acc[i] = acc[i] * acc[(i + 1) % kWide] + in[(step + i) % n];
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kWide; ++i) sum += acc[i] * float(i + 1);
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// A small kernel at a legal size, next to it: only the heavy one may fail.
constexpr int kSmallBlock = 128;
__global__ void small_kernel(float* __restrict__ out) { out[threadIdx.x] = 1.f; }

void launch(const float* in, float* out, int n) {
  heavy_kernel<<<1, kBigBlock>>>(in, out, n);
  small_kernel<<<1, kSmallBlock, 0>>>(out);
}
