// The prefix forest of token sequences (packkit.shared_prefix.build_tree): a radix trie over the sequences,
// built by inserting them in input order, in time linear in their tokens. Pure C++17 (no torch, no Python);
// bound as packkit._planner.prefix_forest.
#pragma once
#include <cstdint>
#include <vector>

namespace packkit {

struct PrefixForestResult {
  // Nodes in preorder (a node, then its children's subtrees; children and roots by the first input sequence
  // that passes through them, i.e. the order in which their first sequence was given).
  std::vector<int64_t> parent;  // -1 for a root
  std::vector<int64_t> length;  // tokens of the node
  std::vector<int64_t> src;     // where the node's tokens start in `tokens` (compact, preorder)
  std::vector<int64_t> tokens;  // every node's tokens once, in preorder
  std::vector<int64_t> seq_node;  // node at which each sequence ends
  std::vector<int64_t> seq_root;  // root (preorder index) of each sequence's tree
  // Per-token "scored" flags parallel to `tokens` when they were given (else empty), and the first disagreement:
  // two sequences that share a token but not its flag (-1 when all agree).
  std::vector<uint8_t> scored;
  int64_t conflict_first = -1, conflict_second = -1, conflict_offset = -1;
};

// Sequence s is tokens[offsets[s] .. offsets[s + 1]) (offsets has n + 1 entries, non-decreasing).
// groups: null (every set of sequences that shares a first token is a tree; empty sequences share one empty
// root) or one id per sequence (sequences share prefixes only within their group; each group is one tree whose
// root holds the group's common prefix, possibly empty). scored: null or one flag per token (its label is not
// -100); a token shared by several sequences must carry the same flag in all of them (else conflict_* name the
// first pair found).
// Throws std::invalid_argument on malformed offsets.
PrefixForestResult build_prefix_forest(const int64_t* tokens, const int64_t* offsets, int64_t n,
                                       const int64_t* groups, const uint8_t* scored = nullptr);

// Per node of a preorder forest (parent[i] < i, -1 for a root): its depth, the position of its first token (the
// tokens of its ancestors) and one past the last node of its subtree. One pass each, no recursion.
// Throws std::invalid_argument unless the parents are preorder.
void forest_metrics(const int64_t* parent, const int64_t* length, int64_t m, int64_t* depth, int64_t* position,
                    int64_t* subtree_end);

}  // namespace packkit
