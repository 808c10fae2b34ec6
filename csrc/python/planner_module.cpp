// pybind11 bindings of the pure C++ planner: numpy in (zero-copy for contiguous int64), numpy out
// (the result vectors are moved into the arrays, not copied). The GIL is released while planning.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../planner/context_parallel_plan.hpp"
#include "../planner/micro_batches.hpp"
#include "../planner/planner.hpp"
#include "../planner/prefix_forest.hpp"

namespace py = pybind11;

namespace {

template <typename Vector>
py::array_t<typename Vector::value_type> to_numpy(Vector&& values) {
  using T = typename Vector::value_type;
  auto* owned = new Vector(std::move(values));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Vector*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(owned->size())}, {sizeof(T)}, owned->data(), free_when_done);
}

py::dict plan(py::array_t<int64_t, py::array::c_style> lengths, int64_t capacity, const std::string& algorithm,
              const std::string& overlong, int64_t dp_size, double cost_a, double cost_b, py::object cost_fn,
              py::object extra_cost, std::vector<int64_t> rank_capacity, std::vector<double> rank_speed,
              int64_t max_items) {
  if (lengths.ndim() != 1) throw packkit::InvalidInput("lengths must be 1-D");
  py::array_t<double, py::array::c_style> extra;
  if (!extra_cost.is_none()) {
    extra = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(extra_cost);
    if (!extra || extra.ndim() != 1 || extra.shape(0) != lengths.shape(0))
      throw packkit::InvalidInput("extra_cost must be a 1-D float array with one entry per length (" +
                                  std::to_string(lengths.shape(0)) + ")");
  }
  packkit::PlanOptions opts;
  opts.capacity = capacity;
  opts.algorithm = packkit::parse_algorithm(algorithm);
  opts.overlong = packkit::parse_overlong(overlong);
  opts.dp_size = dp_size;
  opts.cost = {cost_a, cost_b};
  opts.fill_identity_starts = false;  // numpy's zeros (calloc) are zeroed lazily by the OS
  opts.rank_capacity = std::move(rank_capacity);
  opts.rank_speed = std::move(rank_speed);
  opts.max_items = max_items;

  packkit::ItemCostFn item_cost_fn;
  if (!cost_fn.is_none()) {
    item_cost_fn = [&cost_fn](const std::vector<int64_t>& item_lengths) {
      py::gil_scoped_acquire gil;
      py::array_t<int64_t> arg(static_cast<py::ssize_t>(item_lengths.size()), item_lengths.data());
      auto out = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(cost_fn(arg));
      if (!out || out.ndim() != 1)
        throw packkit::InvalidInput("cost function must return a 1-D array of floats, one per item");
      return std::vector<double>(out.data(), out.data() + out.size());
    };
  }

  packkit::PlanResult result;
  {
    py::gil_scoped_release no_gil;
    result = packkit::make_plan(lengths.data(), lengths.shape(0), opts, item_cost_fn,
                                extra_cost.is_none() ? nullptr : extra.data());
  }
  py::dict out;
  const auto num_segments = static_cast<py::ssize_t>(result.seg_seq.size());
  out["seg_seq"] = to_numpy(std::move(result.seg_seq));
  out["seg_start"] = result.seg_start.empty() && num_segments > 0
                         ? py::module_::import("numpy").attr("zeros")(num_segments, "int64")
                         : py::object(to_numpy(std::move(result.seg_start)));
  out["seg_length"] = to_numpy(std::move(result.seg_length));
  out["bin_offsets"] = to_numpy(std::move(result.bin_offsets));
  out["dropped"] = to_numpy(std::move(result.report.dropped));
  out["truncated"] = to_numpy(std::move(result.report.truncated));
  out["split"] = to_numpy(std::move(result.report.split));
  out["zero_length"] = to_numpy(std::move(result.report.zero_length));
  out["rank_costs"] = to_numpy(std::move(result.rank_costs));
  out["num_steps"] = result.num_steps;
  out["empty_bins"] = result.empty_bins;
  out["kept_tokens"] = result.kept_tokens;
  return out;
}

// packkit.rl.micro_batches' layout at K micro-batches per rank: None if infeasible at K, else a dict with
// order (items grouped by micro-batch rank * K + step, ascending), offsets, tokens, costs. search_rounds > 0: the
// cross-step search (step_search.hpp) where the balance is above search_above.
py::object rl_micro_batches(py::array_t<int64_t, py::array::c_style> lengths,
                            py::array_t<double, py::array::c_style> costs, int64_t capacity, int64_t dp_size,
                            int64_t num_micro_batches, bool equal_count, int refine_rounds, int64_t search_rounds,
                            double search_above, double goal_margin, bool try_next) {
  if (lengths.ndim() != 1 || costs.ndim() != 1 || lengths.shape(0) != costs.shape(0))
    throw packkit::InvalidInput("lengths and costs must be 1-D and of the same size");
  if (refine_rounds < 0 || search_rounds < 0)
    throw packkit::InvalidInput("refine_rounds and search_rounds must be >= 0");
  packkit::MicroBatchLayout result;
  try {
    py::gil_scoped_release no_gil;
    result = packkit::rl_micro_batches(lengths.data(), costs.data(), lengths.shape(0), capacity, dp_size,
                                       num_micro_batches, equal_count, refine_rounds, search_rounds, search_above,
                                       goal_margin, try_next);
  } catch (const std::invalid_argument& e) {
    throw packkit::InvalidInput(e.what());
  }
  if (!result.feasible) return py::none();
  py::dict out;
  out["order"] = to_numpy(std::move(result.order));
  out["offsets"] = to_numpy(std::move(result.offsets));
  out["tokens"] = to_numpy(std::move(result.tokens));
  out["costs"] = to_numpy(std::move(result.costs));
  out["num_micro_batches"] = result.num_micro_batches;
  out["bound"] = result.bound;
  out["goal"] = result.goal;
  return std::move(out);
}

// Token lists -> (flat int64 array, int64 lengths) in one C pass, or None when an item is not a list or tuple
// (the caller converts those itself). A bool, a float or any non-integer is a TypeError naming name[i][k]; with
// non_negative, a negative id is a ValueError naming it (token ids index the embedding; labels may be -100).
py::object flatten_token_lists(py::handle sequences, const std::string& name, bool non_negative) {
  PyObject* seqs = sequences.ptr();
  if (!PyList_Check(seqs) && !PyTuple_Check(seqs)) return py::none();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs);
  PyObject** items = PySequence_Fast_ITEMS(seqs);
  int64_t total = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyList_Check(items[i]) && !PyTuple_Check(items[i])) return py::none();
    total += PySequence_Fast_GET_SIZE(items[i]);
  }
  py::array_t<int64_t> flat(total), lengths(n);
  int64_t* out = flat.mutable_data();
  int64_t* lens = lengths.mutable_data();
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(items[i]);
    PyObject** values = PySequence_Fast_ITEMS(items[i]);
    lens[i] = len;
    for (Py_ssize_t k = 0; k < len; ++k) {
      PyObject* v = values[k];
      long long x;
      if (PyLong_CheckExact(v)) {
        int overflow = 0;
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
          throw py::type_error(name + "[" + std::to_string(i) + "][" + std::to_string(k) +
                               "] does not fit in int64: every element must be an integer token id");
      } else if (PyBool_Check(v)) {
        throw py::type_error(name + "[" + std::to_string(i) + "] holds a bool (at " + std::to_string(k) +
                             "); token ids must be ints");
      } else if (!PyIndex_Check(v)) {
        throw py::type_error(name + "[" + std::to_string(i) + "][" + std::to_string(k) + "] is a " +
                             Py_TYPE(v)->tp_name + ": every element must be an integer token id");
      } else {  // numpy integers, int subclasses
        py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v));
        if (!index) throw py::error_already_set();
        int overflow = 0;
        x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
        if (overflow)
          throw py::type_error(name + "[" + std::to_string(i) + "][" + std::to_string(k) +
                               "] does not fit in int64: every element must be an integer token id");
      }
      if (non_negative && x < 0)
        throw py::value_error(name + "[" + std::to_string(i) + "][" + std::to_string(k) + "] is " + std::to_string(x) +
                              ": token ids index the embedding and must be >= 0");
      *out++ = x;
    }
  }
  return py::make_tuple(flat, lengths);
}

// Per-token label lists (one per sequence, parallel to flat tokens split by offsets) -> one "scored" flag per token
// (uint8), in one C pass and without an int64 copy of the labels: a label is -100 (not scored) or the token itself.
// None when an item is not a list or tuple. Ragged labels, non-ints and other values are errors naming labels[i][k].
py::object label_flags(py::handle labels, py::array_t<int64_t, py::array::c_style> tokens,
                       py::array_t<int64_t, py::array::c_style> offsets) {
  PyObject* seqs = labels.ptr();
  if (!PyList_Check(seqs) && !PyTuple_Check(seqs)) return py::none();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs);
  if (n + 1 != offsets.shape(0))
    throw py::value_error("labels has " + std::to_string(n) + " entries but there are " +
                          std::to_string(offsets.shape(0) - 1) + " sequences: one label list per sequence");
  PyObject** items = PySequence_Fast_ITEMS(seqs);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!PyList_Check(items[i]) && !PyTuple_Check(items[i])) return py::none();
  const int64_t* tok = tokens.data();
  const int64_t* off = offsets.data();
  py::array_t<uint8_t> flags(tokens.shape(0));
  uint8_t* out = flags.mutable_data();
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(items[i]);
    if (len != off[i + 1] - off[i])
      throw py::value_error("labels[" + std::to_string(i) + "] has " + std::to_string(len) + " labels but sequences[" +
                            std::to_string(i) + "] has " + std::to_string(off[i + 1] - off[i]) +
                            " tokens: labels must be parallel to the tokens");
    PyObject** values = PySequence_Fast_ITEMS(items[i]);
    for (Py_ssize_t k = 0; k < len; ++k) {
      PyObject* v = values[k];
      auto where = [i]() { return "labels[" + std::to_string(i) + "]"; };  // built only for an error
      if (PyBool_Check(v))
        throw py::type_error(where() + " holds a bool (at " + std::to_string(k) + "); labels are ints");
      if (!PyLong_Check(v) && !PyIndex_Check(v))
        throw py::type_error(where() + "[" + std::to_string(k) + "] is a " + Py_TYPE(v)->tp_name +
                             ": every element must be an integer label");
      int overflow = 0;
      long long x;
      if (PyLong_CheckExact(v)) {
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
      } else {
        py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v));
        if (!index) throw py::error_already_set();
        x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      }
      const int64_t token = tok[off[i] + k];
      if (overflow || (x != -100 && x != token))
        throw py::value_error(where() + "[" + std::to_string(k) + "] is " + py::str(v).cast<std::string>() +
                              " but sequences[" + std::to_string(i) + "][" + std::to_string(k) + "] is token " +
                              std::to_string(token) + ": a label is -100 (not scored) or the token itself");
      out[off[i] + k] = x != -100;
    }
  }
  return std::move(flags);
}

// packkit.shared_prefix.build_tree's radix build (prefix_forest.hpp): flat int64 tokens + offsets [n + 1],
// optional int64 groups [n] and labels (parallel to tokens).
py::dict prefix_forest(py::array_t<int64_t, py::array::c_style> tokens,
                       py::array_t<int64_t, py::array::c_style> offsets,
                       py::object groups, py::object labels) {
  if (tokens.ndim() != 1 || offsets.ndim() != 1 || offsets.shape(0) < 1)
    throw packkit::InvalidInput("prefix_forest: tokens and offsets must be 1-D (offsets: n + 1 entries)");
  const int64_t n = offsets.shape(0) - 1;
  if (offsets.data()[n] != tokens.shape(0))
    throw packkit::InvalidInput("prefix_forest: offsets must end at the number of tokens");
  py::array_t<int64_t, py::array::c_style> group_array;
  py::array_t<uint8_t, py::array::c_style> label_array;
  const int64_t* group_ptr = nullptr;
  const uint8_t* label_ptr = nullptr;
  if (!groups.is_none()) {
    group_array = py::array_t<int64_t, py::array::c_style>::ensure(groups);
    if (!group_array || group_array.ndim() != 1 || group_array.shape(0) != n)
      throw packkit::InvalidInput("prefix_forest: groups must be int64 [n]");
    group_ptr = group_array.data();
  }
  if (!labels.is_none()) {
    label_array = py::array_t<uint8_t, py::array::c_style>::ensure(labels);
    if (!label_array || label_array.ndim() != 1 || label_array.shape(0) != tokens.shape(0))
      throw packkit::InvalidInput("prefix_forest: scored flags must be uint8, parallel to tokens");
    label_ptr = label_array.data();
  }
  packkit::PrefixForestResult result;
  try {
    py::gil_scoped_release no_gil;
    result = packkit::build_prefix_forest(tokens.data(), offsets.data(), n, group_ptr, label_ptr);
  } catch (const std::invalid_argument& e) {
    throw packkit::InvalidInput(e.what());
  }
  py::dict out;
  out["parent"] = to_numpy(std::move(result.parent));
  out["length"] = to_numpy(std::move(result.length));
  out["src"] = to_numpy(std::move(result.src));
  out["tokens"] = to_numpy(std::move(result.tokens));
  out["seq_node"] = to_numpy(std::move(result.seq_node));
  out["seq_root"] = to_numpy(std::move(result.seq_root));
  out["scored"] = label_ptr ? py::object(to_numpy(std::move(result.scored))) : py::object(py::none());
  out["conflict"] = py::make_tuple(result.conflict_first, result.conflict_second, result.conflict_offset);
  return out;
}

// (depth, position, subtree_end) of a preorder forest's nodes (prefix_forest.hpp).
py::tuple forest_metrics(py::array_t<int64_t, py::array::c_style | py::array::forcecast> parent,
                         py::array_t<int64_t, py::array::c_style | py::array::forcecast> length) {
  if (parent.ndim() != 1 || length.ndim() != 1 || parent.shape(0) != length.shape(0))
    throw packkit::InvalidInput("forest_metrics: parent and length must be 1-D and of one size");
  const int64_t m = parent.shape(0);
  py::array_t<int64_t> depth(m), position(m), end(m);
  try {
    py::gil_scoped_release no_gil;
    packkit::forest_metrics(parent.data(), length.data(), m, depth.mutable_data(), position.mutable_data(),
                            end.mutable_data());
  } catch (const std::invalid_argument& e) {
    throw packkit::InvalidInput(e.what());
  }
  return py::make_tuple(depth, position, end);
}

// Dynamic CP plan (context_parallel_plan.hpp); inputs validated by packkit.planning.context_parallel.
py::dict plan_context_parallel(py::array_t<int64_t, py::array::c_style | py::array::forcecast> lengths,
                               py::array_t<double, py::array::c_style | py::array::forcecast> costs, int64_t world,
                               py::array_t<int64_t, py::array::c_style | py::array::forcecast> caps,
                               py::array_t<double, py::array::c_style | py::array::forcecast> speed, double cp_comm,
                               double pass_overhead, bool pow2, int64_t min_cp, int64_t max_cp, bool pass_barrier) {
  if (lengths.ndim() != 1 || costs.ndim() != 1 || costs.shape(0) != lengths.shape(0))
    throw packkit::InvalidInput("plan_context_parallel: lengths and costs must be 1-D and of one size");
  if (caps.ndim() != 1 || speed.ndim() != 1 || caps.shape(0) != world || speed.shape(0) != world)
    throw packkit::InvalidInput("plan_context_parallel: caps and speed must be 1-D, one per rank");
  packkit::CpOptions opts;
  opts.world = world;
  // Arrays, not lists: a per-rank Python list of 2^20 ranks cost more to convert than the plan (issue 63).
  opts.caps.assign(caps.data(), caps.data() + world);
  opts.speed.assign(speed.data(), speed.data() + world);
  opts.cp_comm = cp_comm;
  opts.pass_overhead = pass_overhead;
  opts.pow2 = pow2;
  opts.min_cp = min_cp;
  opts.max_cp = max_cp;
  opts.pass_barrier = pass_barrier;
  packkit::CpPlan r;
  {
    py::gil_scoped_release no_gil;
    r = packkit::plan_context_parallel(lengths.data(), costs.data(), lengths.shape(0), opts);
  }
  py::dict out;
  out["rank_start"] = to_numpy(std::move(r.rank_start));
  out["group_size"] = to_numpy(std::move(r.group_size));
  out["offsets"] = to_numpy(std::move(r.offsets));
  out["seqs"] = to_numpy(std::move(r.seqs));
  out["step"] = to_numpy(std::move(r.step));
  out["local_tokens"] = to_numpy(std::move(r.local_tokens));
  out["start"] = to_numpy(std::move(r.start));
  out["duration"] = to_numpy(std::move(r.duration));
  out["cp_size"] = to_numpy(std::move(r.cp_size));
  out["makespan"] = r.makespan;
  out["lower_bound"] = r.lower_bound;
  out["num_steps"] = r.num_steps;
  out["candidates"] = r.candidates;
  return out;
}

}  // namespace

void bind_pipeline(py::module_& m);  // pipeline_bindings.cpp

PYBIND11_MODULE(_planner, m) {
  bind_pipeline(m);
  m.doc() = "packkit's C++ bin-packing planner (use packkit.plan; this is the raw binding)";
  py::register_exception<packkit::InvalidInput>(m, "InvalidInput", PyExc_ValueError);
  m.def("plan", &plan, py::arg("lengths"), py::arg("capacity"), py::arg("algorithm"), py::arg("overlong"),
        py::arg("dp_size"), py::arg("cost_a"), py::arg("cost_b"), py::arg("cost_fn") = py::none(),
        py::arg("extra_cost") = py::none(), py::arg("rank_capacity") = std::vector<int64_t>{},
        py::arg("rank_speed") = std::vector<double>{}, py::arg("max_items") = 0);
  m.def("rl_micro_batches", &rl_micro_batches, py::arg("lengths"), py::arg("costs"), py::arg("capacity"),
        py::arg("dp_size"), py::arg("num_micro_batches"), py::arg("equal_count"), py::arg("refine_rounds") = 256,
        py::arg("search_rounds") = 0, py::arg("search_above") = 1.0, py::arg("goal_margin") = -1.0,
        py::arg("try_next") = false);
  m.def("prefix_forest", &prefix_forest, py::arg("tokens"), py::arg("offsets"), py::arg("groups") = py::none(),
        py::arg("labels") = py::none());
  m.def("label_flags", &label_flags, py::arg("labels"), py::arg("tokens"), py::arg("offsets"));
  m.def("plan_context_parallel", &plan_context_parallel, py::arg("lengths"), py::arg("costs"), py::arg("world"),
        py::arg("caps"), py::arg("speed"), py::arg("cp_comm"), py::arg("pass_overhead"), py::arg("pow2"),
        py::arg("min_cp"), py::arg("max_cp"), py::arg("pass_barrier"));
  m.def("forest_metrics", &forest_metrics, py::arg("parent"), py::arg("length"));
  m.def("flatten_token_lists", &flatten_token_lists, py::arg("sequences"), py::arg("name"),
        py::arg("non_negative") = true);
}
