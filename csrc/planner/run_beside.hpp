// Two-core overlap for the planner's independent passes. The machines packkit plans on have at least
// two cores; a plan of millions of items spends a large share of its time in passes that do not
// depend on each other.
#pragma once

#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>

namespace packkit {

// Below this much work (items) a thread costs more than it saves.
constexpr int64_t kParallelItems = int64_t{1} << 18;

// Runs `side` on a second thread while `main` runs on this one when `parallel` and a second core is
// there; otherwise one after the other. Both have finished when it returns or throws, and an exception
// from either is rethrown here, never let out of a thread (std::terminate).
template <class Side, class Main>
void run_beside(bool parallel, Side&& side, Main&& main) {
  std::exception_ptr side_failed;
  std::thread worker;
  if (parallel && std::thread::hardware_concurrency() > 1) {
    try {
      worker = std::thread([&] {
        try {
          side();
        } catch (...) {
          side_failed = std::current_exception();
        }
      });
    } catch (const std::system_error&) {  // no thread to be had: both run here
    }
  }
  try {
    main();
  } catch (...) {
    if (worker.joinable()) worker.join();
    throw;
  }
  if (worker.joinable())
    worker.join();
  else
    side();
  if (side_failed) std::rethrow_exception(side_failed);
}

}  // namespace packkit
