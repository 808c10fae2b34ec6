// Planted for tests/test_check_cuda_resources.py: a block size computed at run time, which the check cannot
// vouch for (no constexpr, no __launch_bounds__), so it must fail; bounded_kernel carries __launch_bounds__ and
// passes at the same run-time size.
__global__ void runtime_block_kernel(float* out) { out[threadIdx.x] = 0.f; }
__global__ void __launch_bounds__(256) bounded_kernel(float* out) { out[threadIdx.x] = 0.f; }

void launch(float* out, int threads) {
  runtime_block_kernel<<<1, threads>>>(out);
  bounded_kernel<<<1, 256>>>(out);
}
