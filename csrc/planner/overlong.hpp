// Turns source lengths into packable items under the over-long policy.
#pragma once
#include "plan_types.hpp"

namespace packkit {

// Validates lengths (non-negative) and capacity (> 0), then applies `policy` to every length above
// capacity. Zero-length sequences become no item (they occupy no tokens) and are reported.
// Throws InvalidInput for bad input and for over-long sequences under OverlongPolicy::Error.
Items make_items(const int64_t* lengths, int64_t n, int64_t capacity, OverlongPolicy policy,
                 PolicyReport& report);

}  // namespace packkit
