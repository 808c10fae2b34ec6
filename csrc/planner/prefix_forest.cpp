// Radix-trie build of a prefix forest (see prefix_forest.hpp).
//
// Sequences are inserted in input order. A node covers depths [start, end) of the sequence `seq` that
// created it (its tokens are read there, never copied until the output). Walking a sequence down the trie
// compares its tokens with each edge's in place, so the build is linear in the tokens; children are found by
// (node, first token) in one open-addressing hash table, so a node with many children costs O(1) per lookup.
// Splitting an edge keeps the lower part's index (its children's keys stay valid) and gives the upper part a
// new node that takes over the parent's key. Because sequences arrive in order, a node's first sequence is
// fixed when it is created (a split's upper part inherits it), which is the order the output sorts by.
#include "prefix_forest.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace packkit {
namespace {

struct Node {
  int64_t parent;  // -1: a root (or, ungrouped, a child of the virtual root)
  int64_t start, end;  // depths in the sequence that owns the tokens
  int64_t seq;  // sequence whose tokens [start, end) the node covers
  int64_t first;  // first sequence (input order) passing through the node
};

// (parent node, first token) -> child. Linear probing, power-of-two size, grown at 1/2 load.
class ChildTable {
 public:
  explicit ChildTable(size_t expected) {
    size_t size = 16;
    while (size < expected * 2) size *= 2;  // a power of two: slots are hash & (size - 1)
    rehash(size);
  }
  int64_t find(int64_t parent, int64_t token) const {
    for (size_t i = slot(parent, token);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.child < 0) return -1;
      if (e.parent == parent && e.token == token) return e.child;
    }
  }
  void set(int64_t parent, int64_t token, int64_t child) {  // insert or overwrite
    if ((used_ + 1) * 2 > entries_.size()) rehash(entries_.size() * 2);
    for (size_t i = slot(parent, token);; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.child < 0) {
        e = {parent, token, child};
        ++used_;
        return;
      }
      if (e.parent == parent && e.token == token) {
        e.child = child;
        return;
      }
    }
  }

 private:
  struct Entry {
    int64_t parent, token, child;
  };
  size_t slot(int64_t parent, int64_t token) const {
    uint64_t h = static_cast<uint64_t>(parent) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(token);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return static_cast<size_t>(h) & mask_;
  }
  void rehash(size_t size) {
    std::vector<Entry> old;
    old.swap(entries_);
    entries_.assign(size, Entry{0, 0, -1});
    mask_ = size - 1;
    used_ = 0;
    for (const Entry& e : old)
      if (e.child >= 0) set(e.parent, e.token, e.child);
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0, used_ = 0;
};

}  // namespace

PrefixForestResult build_prefix_forest(const int64_t* tokens, const int64_t* offsets, int64_t n,
                                       const int64_t* groups, const uint8_t* scored) {
  if (n < 0) throw std::invalid_argument("prefix_forest: negative sequence count");
  if (n > 0 && offsets[0] != 0) throw std::invalid_argument("prefix_forest: offsets must start at 0");
  for (int64_t s = 0; s < n; ++s)
    if (offsets[s + 1] < offsets[s]) throw std::invalid_argument("prefix_forest: offsets must be non-decreasing");

  PrefixForestResult out;
  std::vector<Node> nodes;
  nodes.reserve(static_cast<size_t>(2 * n + 1));
  ChildTable children(static_cast<size_t>(2 * n + 1));
  std::vector<int64_t> seq_node(static_cast<size_t>(n));
  const bool grouped = groups != nullptr;
  ChildTable group_root(grouped ? static_cast<size_t>(n) : 0);  // (0, group id) -> root node
  int64_t empty_root = -1;  // ungrouped: the one root every empty sequence ends at
  auto new_node = [&](int64_t parent, int64_t start, int64_t end, int64_t seq) {
    nodes.push_back({parent, start, end, seq, seq});
    return static_cast<int64_t>(nodes.size()) - 1;
  };
  auto conflict = [&](int64_t a, int64_t b, int64_t depth) {
    if (out.conflict_first < 0) {
      out.conflict_first = std::min(a, b);
      out.conflict_second = std::max(a, b);
      out.conflict_offset = depth;
    }
  };

  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = offsets[i + 1] - offsets[i];
    const int64_t* t = tokens + offsets[i];
    int64_t cur = -1;  // the virtual root (ungrouped) or the group's root
    if (grouped) {
      cur = group_root.find(0, groups[i]);
      if (cur < 0) {
        cur = new_node(-1, 0, 0, i);
        group_root.set(0, groups[i], cur);
      }
    } else if (len == 0) {
      if (empty_root < 0) empty_root = new_node(-1, 0, 0, i);
      seq_node[static_cast<size_t>(i)] = empty_root;
      continue;
    }
    int64_t depth = 0;
    while (true) {
      if (depth == len) {  // ends exactly at cur
        seq_node[static_cast<size_t>(i)] = cur;
        break;
      }
      const int64_t child = children.find(cur, t[depth]);
      if (child < 0) {
        const int64_t leaf = new_node(cur, depth, len, i);
        children.set(cur, t[depth], leaf);
        seq_node[static_cast<size_t>(i)] = leaf;
        break;
      }
      const Node c = nodes[static_cast<size_t>(child)];
      const int64_t stop = std::min(c.end, len);
      const int64_t* edge = tokens + offsets[c.seq];
      int64_t d = depth + 1;  // the first token matched through the table
      while (d < stop && edge[d] == t[d]) ++d;
      if (scored) {
        const uint8_t* mine = scored + offsets[i];
        const uint8_t* theirs = scored + offsets[c.seq];
        for (int64_t k = depth; k < d; ++k)
          if (mine[k] != theirs[k]) {
            conflict(c.seq, i, k);
            break;
          }
      }
      if (d == c.end) {  // the whole edge matched: go down
        cur = child;
        depth = d;
        continue;
      }
      // Split the edge at d: a new upper node takes the parent's key; the lower part keeps its index.
      const int64_t mid = new_node(cur, c.start, d, c.seq);
      nodes[static_cast<size_t>(mid)].first = c.first;
      nodes[static_cast<size_t>(child)].parent = mid;
      nodes[static_cast<size_t>(child)].start = d;
      children.set(cur, t[depth], mid);
      children.set(mid, edge[d], child);
      cur = mid;
      depth = d;
    }
  }

  // Grouped: a group's root is empty; with no sequence ending there and one child, that child is the root.
  const size_t m = nodes.size();
  std::vector<int64_t> child_count(m, 0);
  for (const Node& node : nodes)
    if (node.parent >= 0) ++child_count[static_cast<size_t>(node.parent)];
  std::vector<char> ends_here(m, 0), removed(m, 0);
  for (int64_t s = 0; s < n; ++s) ends_here[static_cast<size_t>(seq_node[static_cast<size_t>(s)])] = 1;
  if (grouped)
    for (size_t k = 0; k < m; ++k)
      if (nodes[k].parent < 0 && !ends_here[k] && child_count[k] == 1) removed[k] = 1;
  for (Node& node : nodes)
    if (node.parent >= 0 && removed[static_cast<size_t>(node.parent)]) node.parent = -1;

  // Children (and roots) ordered by their first sequence: counting sort by first, then stable by parent.
  std::vector<int64_t> by_first_count(static_cast<size_t>(n) + 1, 0);
  for (size_t k = 0; k < m; ++k)
    if (!removed[k]) ++by_first_count[static_cast<size_t>(nodes[k].first) + 1];
  for (int64_t s = 0; s < n; ++s) by_first_count[static_cast<size_t>(s) + 1] += by_first_count[static_cast<size_t>(s)];
  std::vector<int64_t> by_first(m);
  size_t kept = 0;
  for (size_t k = 0; k < m; ++k)
    if (!removed[k]) {
      by_first[static_cast<size_t>(by_first_count[static_cast<size_t>(nodes[k].first)]++)] = static_cast<int64_t>(k);
      ++kept;
    }
  by_first.resize(kept);
  // CSR of children per parent (slot 0: the roots), each list in first order.
  std::vector<int64_t> child_start(m + 2, 0);
  for (int64_t k : by_first) ++child_start[static_cast<size_t>(nodes[static_cast<size_t>(k)].parent + 1) + 1];
  for (size_t p = 0; p <= m; ++p) child_start[p + 1] += child_start[p];
  std::vector<int64_t> child_list(kept), fill(child_start.begin(), child_start.end() - 1);
  for (int64_t k : by_first)
    child_list[static_cast<size_t>(fill[static_cast<size_t>(nodes[static_cast<size_t>(k)].parent + 1)]++)] = k;

  // Preorder by an explicit stack (deep trees must not recurse).
  std::vector<int64_t> new_index(m, -1), preorder;
  preorder.reserve(kept);
  std::vector<int64_t> stack;
  for (int64_t r = child_start[1] - 1; r >= child_start[0]; --r) stack.push_back(child_list[static_cast<size_t>(r)]);
  while (!stack.empty()) {
    const int64_t k = stack.back();
    stack.pop_back();
    new_index[static_cast<size_t>(k)] = static_cast<int64_t>(preorder.size());
    preorder.push_back(k);
    const size_t slot = static_cast<size_t>(k) + 1;
    for (int64_t c = child_start[slot + 1] - 1; c >= child_start[slot]; --c)
      stack.push_back(child_list[static_cast<size_t>(c)]);
  }

  out.parent.resize(kept);
  out.length.resize(kept);
  out.src.resize(kept);
  std::vector<int64_t> root_of(kept);
  int64_t total = 0;
  for (size_t j = 0; j < kept; ++j) {
    const Node& node = nodes[static_cast<size_t>(preorder[j])];
    const int64_t p = node.parent < 0 ? -1 : new_index[static_cast<size_t>(node.parent)];
    const int64_t start = node.parent < 0 ? 0 : node.start;  // a promoted root starts at depth 0
    out.parent[j] = p;
    out.length[j] = node.end - start;
    out.src[j] = total;
    root_of[j] = p < 0 ? static_cast<int64_t>(j) : root_of[static_cast<size_t>(p)];
    total += node.end - start;
  }
  out.tokens.resize(static_cast<size_t>(total));
  if (scored) out.scored.resize(static_cast<size_t>(total));
  for (size_t j = 0; j < kept; ++j) {
    const Node& node = nodes[static_cast<size_t>(preorder[j])];
    const int64_t start = node.parent < 0 ? 0 : node.start;
    const int64_t from = offsets[node.seq] + start;
    std::copy(tokens + from, tokens + from + out.length[j], out.tokens.begin() + out.src[j]);
    if (scored) std::copy(scored + from, scored + from + out.length[j], out.scored.begin() + out.src[j]);
  }
  out.seq_node.resize(static_cast<size_t>(n));
  out.seq_root.resize(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) {
    const int64_t node = new_index[static_cast<size_t>(seq_node[static_cast<size_t>(s)])];
    out.seq_node[static_cast<size_t>(s)] = node;
    out.seq_root[static_cast<size_t>(s)] = root_of[static_cast<size_t>(node)];
  }
  return out;
}

void forest_metrics(const int64_t* parent, const int64_t* length, int64_t m, int64_t* depth, int64_t* position,
                    int64_t* subtree_end) {
  for (int64_t i = 0; i < m; ++i) {
    const int64_t p = parent[i];
    if (p < -1 || p >= i) throw std::invalid_argument("forest_metrics: parents must be preorder");
    depth[i] = p < 0 ? 0 : depth[p] + 1;
    position[i] = p < 0 ? 0 : position[p] + length[p];
    subtree_end[i] = i + 1;
  }
  for (int64_t i = m - 1; i >= 0; --i)  // children come after parents: fold ends upwards
    if (parent[i] >= 0) subtree_end[parent[i]] = std::max(subtree_end[parent[i]], subtree_end[i]);
}

}  // namespace packkit
