// pybind11 bindings of the pipeline planner and simulator (csrc/planner/pipeline_plan.hpp), registered into
// packkit._planner by bind_pipeline (planner_module.cpp). Inputs are validated by packkit.pipeline first.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "../planner/pipeline_plan.hpp"
#include "../planner/plan_types.hpp"

namespace py = pybind11;
namespace pl = packkit::pipeline;

namespace {

template <typename T>
py::array_t<T> as_array(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict pp_simulate(py::array_t<double, py::array::c_style | py::array::forcecast> fwd,
                     py::array_t<double, py::array::c_style | py::array::forcecast> bwd,
                     py::array_t<double, py::array::c_style | py::array::forcecast> wgt, const std::string& schedule,
                     int64_t pp, int64_t virtual_stages, double p2p) {
  if (fwd.ndim() != 2 || bwd.ndim() != 2 || wgt.ndim() != 2 || fwd.shape(0) != bwd.shape(0) ||
      fwd.shape(1) != bwd.shape(1) || wgt.shape(0) != fwd.shape(0) || wgt.shape(1) != fwd.shape(1) ||
      fwd.shape(1) != pp * virtual_stages)
    throw packkit::InvalidInput("pp_simulate: costs must be [micro-batches, pp_size * virtual_stages]");
  pl::StageCosts c;
  c.m = fwd.shape(0);
  c.stages = fwd.shape(1);
  c.fwd.assign(fwd.data(), fwd.data() + fwd.size());
  c.bwd.assign(bwd.data(), bwd.data() + bwd.size());
  c.wgt.assign(wgt.data(), wgt.data() + wgt.size());
  pl::SimResult r;
  try {
    const auto sched = pl::parse_schedule(schedule);
    py::gil_scoped_release no_gil;
    r = pl::simulate(pl::rank_orders(sched, pp, virtual_stages, c.m), c, pp, p2p);
  } catch (const std::invalid_argument& e) {
    throw packkit::InvalidInput(e.what());
  }
  py::dict out;
  out["makespan"] = r.makespan;
  out["busy"] = as_array(r.busy);
  out["lower_bound"] = r.lower_bound;
  return out;
}

py::list pp_orders(const std::string& schedule, int64_t pp, int64_t virtual_stages, int64_t m) {
  py::list out;
  for (const auto& ops : pl::rank_orders(pl::parse_schedule(schedule), pp, virtual_stages, m)) {
    py::list rank;
    for (const auto& op : ops) rank.append(py::make_tuple(op.stage, "FBW"[op.kind], op.mb));
    out.append(rank);
  }
  return out;
}

py::dict plan_pipeline(py::array_t<int64_t, py::array::c_style | py::array::forcecast> lengths,
                       py::array_t<double, py::array::c_style | py::array::forcecast> costs, int64_t capacity,
                       int64_t pp, int64_t dp, int64_t num_microbatches, const std::string& schedule,
                       int64_t virtual_stages, int64_t microbatch_group, std::vector<double> layer_weights,
                       double bwd_ratio, double weight_fraction, double p2p, int64_t order_rounds,
                       double row_base) {
  if (lengths.ndim() != 1 || costs.ndim() != 1 || lengths.shape(0) != costs.shape(0))
    throw packkit::InvalidInput("plan_pipeline: lengths and costs must be 1-D and of one size");
  pl::PipelineOptions o;
  o.capacity = capacity;
  o.pp = pp;
  o.dp = dp;
  o.m = num_microbatches;
  o.virtual_stages = virtual_stages;
  o.microbatch_group = microbatch_group;
  o.layer_weights = std::move(layer_weights);
  o.bwd_ratio = bwd_ratio;
  o.weight_fraction = weight_fraction;
  o.p2p = p2p;
  o.order_rounds = order_rounds;
  o.row_base = row_base;
  pl::PipelinePlan r;
  try {
    o.schedule = pl::parse_schedule(schedule);
    py::gil_scoped_release no_gil;
    r = pl::plan_pipeline(lengths.data(), costs.data(), lengths.shape(0), o);
  } catch (const std::invalid_argument& e) {
    throw packkit::InvalidInput(e.what());
  }
  py::dict out;
  out["docs"] = as_array(r.docs);
  out["row_offsets"] = as_array(r.row_offsets);
  out["row_cost"] = as_array(r.row_cost);
  out["rank_makespan"] = as_array(r.rank_makespan);
  out["rank_bound"] = as_array(r.rank_bound);
  out["num_microbatches"] = r.m;
  out["makespan"] = r.makespan;
  out["lower_bound"] = r.lower_bound;
  out["data_bound"] = r.data_bound;
  return out;
}

}  // namespace

void bind_pipeline(py::module_& m) {
  m.def("pp_simulate", &pp_simulate, py::arg("fwd"), py::arg("bwd"), py::arg("wgt"), py::arg("schedule"),
        py::arg("pp"), py::arg("virtual_stages"), py::arg("p2p"));
  m.def("pp_orders", &pp_orders, py::arg("schedule"), py::arg("pp"), py::arg("virtual_stages"), py::arg("m"));
  m.def("plan_pipeline", &plan_pipeline, py::arg("lengths"), py::arg("costs"), py::arg("capacity"), py::arg("pp"),
        py::arg("dp"), py::arg("num_microbatches"), py::arg("schedule"), py::arg("virtual_stages"),
        py::arg("microbatch_group"), py::arg("layer_weights"), py::arg("bwd_ratio"), py::arg("weight_fraction"),
        py::arg("p2p"), py::arg("order_rounds"), py::arg("row_base") = 0.0);
  m.def("valid_microbatches", [](const std::string& schedule, int64_t pp, int64_t v, int64_t group, int64_t at_least) {
    return pl::valid_microbatches(pl::parse_schedule(schedule), pp, v, group, at_least);
  }, py::arg("schedule"), py::arg("pp"), py::arg("virtual_stages"), py::arg("microbatch_group"), py::arg("at_least"));
}
