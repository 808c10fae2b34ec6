// Planted for tests/test_check_cuda_resources.py: a block that is not a multiple of the 32-thread warp, and
// static shared memory past 48 KiB through dynamic shared memory over the arch's per-block maximum.
constexpr int kOdd = 100;
constexpr int kHugeDynamic = 300 * 1024;
__global__ void odd_kernel(float* out) { out[threadIdx.x] = 0.f; }
__global__ void smem_kernel(float* out) {
  extern __shared__ float buf[];
  buf[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
}

void launch(float* out) {
  odd_kernel<<<1, kOdd>>>(out);
  smem_kernel<<<1, 256, kHugeDynamic>>>(out);
}
