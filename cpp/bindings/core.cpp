// Mirrors cpp/core/core.h: error classes, logging, threads.
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>

#include "common.h"
#include "core/handoff.h"

namespace socllm::py_bind {

namespace {

// The exception a Python signal handler raised during a long call (the interrupt hook takes it
// with the GIL held; the translator raises it once the call has unwound). Main thread only.
struct PendingSignal {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
} g_pending_signal;

// Creates `socllm.<name>` deriving from the given Python bases.
py::object make_exception(py::module_& m, const char* name, py::tuple bases) {
  std::string qual = std::string("socllm.") + name;
  PyObject* t = PyErr_NewException(qual.c_str(), bases.ptr(), nullptr);
  if (!t) throw py::error_already_set();
  py::object cls = py::reinterpret_steal<py::object>(t);
  m.attr(name) = cls;
  return cls;
}

}  // namespace

py::str str_from_file(const std::string& s) {
  PyObject* u =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!u) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(u);
}

std::string str_to_file(const py::handle& s) {
  if (!PyUnicode_Check(s.ptr()))
    throw InvalidArgument("[socllm] expected a name (str), got " +
                          std::string(py::str(py::type::of(s).attr("__name__"))));
  PyObject* b = PyUnicode_AsEncodedString(s.ptr(), "utf-8", "surrogateescape");
  if (!b) {
    PyErr_Clear();
    throw InvalidArgument("[socllm] the name " + std::string(py::repr(s)) +
                          " is not valid Unicode");
  }
  std::string out(PyBytes_AS_STRING(b), static_cast<size_t>(PyBytes_GET_SIZE(b)));
  Py_DECREF(b);
  return out;
}

py::object json_to_py(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return py::none();
    case nlohmann::json::value_t::boolean: return py::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float: return py::float_(j.get<double>());
    case nlohmann::json::value_t::string: return str_from_file(j.get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      py::list l;
      for (const auto& e : j) l.append(json_to_py(e));
      return std::move(l);
    }
    case nlohmann::json::value_t::object: {
      py::dict d;
      for (const auto& [k, v] : j.items()) d[str_from_file(k)] = json_to_py(v);
      return std::move(d);
    }
    default: return py::none();
  }
}

namespace {
// Deeper nesting than any plan or config has; a cycle (d["ops"] = d) or 10^5 nested lists
// would otherwise overflow the C stack.
constexpr int kMaxJsonDepth = 64;
nlohmann::json py_to_json_at(const py::handle& o, const char* fn, int depth);
}  // namespace

nlohmann::json py_to_json(const py::handle& o, const char* fn) { return py_to_json_at(o, fn, 0); }

namespace {
nlohmann::json py_to_json_at(const py::handle& o, const char* fn, int depth) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(std::string("[") + fn + "] " + why + ": " +
                           std::string(py::repr(o)).substr(0, 200));
  };
  if (depth > kMaxJsonDepth)
    throw InvalidArgument(std::string("[") + fn + "] nested deeper than " +
                          std::to_string(kMaxJsonDepth) +
                          " levels (a value that contains itself?)");
  if (o.is_none()) return nullptr;
  if (PyBool_Check(o.ptr())) return o.ptr() == Py_True;
  if (PyLong_Check(o.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
    if (overflow == 0) return static_cast<int64_t>(v);
    const unsigned long long u = PyLong_AsUnsignedLongLong(o.ptr());
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      throw bad("integer does not fit in 64 bits");
    }
    return static_cast<uint64_t>(u);
  }
  if (PyFloat_Check(o.ptr())) {
    const double v = PyFloat_AsDouble(o.ptr());
    if (!std::isfinite(v)) throw bad("numbers must be finite");
    return v;
  }
  if (PyUnicode_Check(o.ptr())) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(o.ptr(), &n);
    if (!s) {
      PyErr_Clear();
      throw bad("string is not valid Unicode");
    }
    return std::string(s, static_cast<size_t>(n));
  }
  // a read-only mapping (a model's config) reads as the dict it wraps
  if (!PyDict_Check(o.ptr()) && PyObject_TypeCheck(o.ptr(), &PyDictProxy_Type))
    return py_to_json_at(py::dict(py::reinterpret_borrow<py::object>(o)), fn, depth);
  if (PyDict_Check(o.ptr())) {
    nlohmann::json j = nlohmann::json::object();
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(o)) {
      if (!PyUnicode_Check(k.ptr())) throw bad("dictionary keys must be strings");
      const std::string key = py_to_json_at(k, fn, depth + 1).get<std::string>();
      try {
        j[key] = py_to_json_at(v, fn, depth + 1);
      } catch (const InvalidArgument& e) {  // name the key: "[Plan] alpha: numbers must be..."
        const std::string what = e.what(), prefix = std::string("[") + fn + "] ";
        throw InvalidArgument(prefix + key + ": " +
                              (what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what));
      }
    }
    return j;
  }
  if (PyList_Check(o.ptr()) || PyTuple_Check(o.ptr())) {
    nlohmann::json j = nlohmann::json::array();
    for (py::handle v : o) j.push_back(py_to_json_at(v, fn, depth + 1));
    return j;
  }
  // numpy scalars and 0-d arrays (np.int64(64), np.float32(0.5), np.bool_) as their Python value
  static const py::object np_generic = py::module_::import("numpy").attr("generic");
  if (py::isinstance(o, np_generic) ||
      (py::isinstance<py::array>(o) && py::reinterpret_borrow<py::array>(o).ndim() == 0))
    return py_to_json_at(o.attr("item")(), fn, depth + 1);
  throw bad("cannot use a value of type " + std::string(py::str(py::type::of(o).attr("__name__"))) +
            " here");
}

}  // namespace

int64_t to_int64(const py::handle& v, const char* fn, const char* name) {
  PyObject* idx = PyNumber_Index(v.ptr());  // ints and numpy integers, not floats or bools' kin
  if (!idx || PyBool_Check(v.ptr())) {
    Py_XDECREF(idx);
    PyErr_Clear();
    throw InvalidArgument(std::string("[") + fn + "] " + name + " must be an integer, got " +
                          std::string(py::repr(v)).substr(0, 100));
  }
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(idx, &overflow);
  Py_DECREF(idx);
  if (overflow != 0)
    throw InvalidArgument(std::string("[") + fn + "] " + name + " = " +
                          std::string(py::repr(v)).substr(0, 100) + " does not fit in 64 bits");
  return x;
}

std::vector<int32_t> to_token_ids(const py::handle& seq, const char* fn) {
  if (py::isinstance<py::str>(seq) || py::isinstance<py::bytes>(seq))
    throw InvalidArgument(std::string("[") + fn +
                          "] expected a sequence of token ids, got a string");
  std::vector<int32_t> out;
  for (py::handle item : py::iter(seq)) {
    PyObject* idx = PyNumber_Index(item.ptr());
    if (!idx) {
      PyErr_Clear();
      throw InvalidArgument(std::string("[") + fn + "] token ids must be integers, got " +
                            std::string(py::str(py::type::of(item).attr("__name__"))));
    }
    long long v = PyLong_AsLongLong(idx);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw InvalidArgument(std::string("[") + fn + "] token id " + std::string(py::str(item)) +
                            " is out of range");
    }
    if (v < INT32_MIN || v > INT32_MAX)
      throw InvalidArgument(std::string("[") + fn + "] token id " + std::to_string(v) +
                            " is out of range");
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

void init_core(py::module_& m) {
  py::object base = make_exception(m, "SocllmError", py::make_tuple(py::handle(PyExc_Exception)));
  py::object invalid =
      make_exception(m, "InvalidArgumentError", py::make_tuple(base, py::handle(PyExc_ValueError)));
  py::object shape = make_exception(m, "ShapeError", py::make_tuple(invalid));
  py::object overflow = make_exception(m, "ContextOverflowError", py::make_tuple(invalid));
  py::object missing = make_exception(m, "MissingFileError",
                                      py::make_tuple(base, py::handle(PyExc_FileNotFoundError)));
  py::object format =
      make_exception(m, "FormatError", py::make_tuple(base, py::handle(PyExc_ValueError)));
  py::object unsupported = make_exception(
      m, "UnsupportedError", py::make_tuple(base, py::handle(PyExc_NotImplementedError)));

  // The translator must be a plain function, so the classes live in statics (held for the
  // life of the interpreter, like the module itself).
  static PyObject *s_base, *s_invalid, *s_shape, *s_overflow, *s_missing, *s_format, *s_unsupported;
  s_base = base.release().ptr();
  s_invalid = invalid.release().ptr();
  s_shape = shape.release().ptr();
  s_overflow = overflow.release().ptr();
  s_missing = missing.release().ptr();
  s_format = format.release().ptr();
  s_unsupported = unsupported.release().ptr();
  // Most derived first: the first matching catch wins.
  py::register_exception_translator([](std::exception_ptr p) {
    // Messages quote names read from files, which need not be UTF-8 (PyErr_SetString would
    // fail on them): undecodable bytes show as \xNN escapes.
    auto set = [](PyObject* cls, const char* what) {
      PyObject* msg = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)),
                                           "backslashreplace");
      if (!msg) return;
      PyErr_SetObject(cls, msg);
      Py_DECREF(msg);
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      set(s_shape, e.what());
    } catch (const ContextOverflow& e) {
      set(s_overflow, e.what());
    } catch (const InvalidArgument& e) {
      set(s_invalid, e.what());
    } catch (const MissingFile& e) {
      set(s_missing, e.what());
    } catch (const FormatError& e) {
      set(s_format, e.what());
    } catch (const Unsupported& e) {
      set(s_unsupported, e.what());
    } catch (const Interrupted&) {
      if (g_pending_signal.type) {  // what the signal handler raised
        PyErr_Restore(g_pending_signal.type, g_pending_signal.value, g_pending_signal.traceback);
        g_pending_signal = {};
      } else {
        PyErr_SetNone(PyExc_KeyboardInterrupt);
      }
    } catch (const Error& e) {
      set(s_base, e.what());
    } catch (const nlohmann::json::exception& e) {
      // JSON from a caller or a file with a value of the wrong type that a check missed: still
      // the caller's bad value, not an internal RuntimeError.
      set(s_invalid, (std::string("[json] ") + e.what()).c_str());
    }
  });
  // Long calls poll for Ctrl-C between layers (core.h): a signal Python has caught is pending
  // until the main thread runs Python again, so ask it here. The KeyboardInterrupt itself is
  // raised by the translator above once the call has unwound.
  // Only the main thread runs Python's signal handlers: other threads return at once, without
  // taking the GIL. The exception a handler raised (KeyboardInterrupt, or a SIGALRM handler's
  // TimeoutError) is kept and restored by the translator.
  static unsigned long s_main_thread = 0;
  s_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  set_interrupt_hook([]() -> bool {
    if (PyThread_get_thread_ident() != s_main_thread || !Py_IsInitialized()) return false;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    PyErr_Fetch(&g_pending_signal.type, &g_pending_signal.value, &g_pending_signal.traceback);
    return true;
  });

  m.def("set_log_level", &set_log_level, py::arg("level"),
        "C++ log level: trace, debug, info, warn, error, critical, off.");
  m.def("log_level", &log_level);
  m.def(
      "set_num_threads",
      [](const py::handle& n) { set_num_threads(to_int64(n, "set_num_threads", "n")); },
      py::arg("n"),
      "Threads for socllm kernels (OpenMP loops and OpenBLAS); default 2, at most "
      "max_num_threads() (4 per CPU).");
  m.def("num_threads", &num_threads);
  m.def("max_num_threads", &max_num_threads);
  m.def(
      "blas_info",
      [] {
        py::dict d;
        d["corename"] = blas_corename();
        d["config"] = blas_config();
        return d;
      },
      "OpenBLAS kernel set (core name) and build configuration in use.");
  m.def("wait_methods", &wait_method_names, "The handoff waiting methods (handoff.h).");
  m.def(
      "measure_handoff",
      [](const std::string& method, const py::handle& iterations, double work_us,
         double predicted_us, double sleep_margin_us, const py::handle& warmup) {
        HandoffOptions o;
        o.method = wait_method_from_name(method);
        o.iterations = to_int64(iterations, "measure_handoff", "iterations");
        o.warmup = to_int64(warmup, "measure_handoff", "warmup");
        o.work_us = work_us;
        o.predicted_us = predicted_us;
        o.sleep_margin_us = sleep_margin_us;
        HandoffSamples r;
        {
          py::gil_scoped_release nogil;
          r = measure_handoff(o);
        }
        py::dict d;
        d["latency_us"] =
            py::array_t<double>(py::ssize_t(r.latency_us.size()), r.latency_us.data());
        d["waiter_cpu_us"] =
            py::array_t<double>(py::ssize_t(r.waiter_cpu_us.size()), r.waiter_cpu_us.data());
        d["wait_us"] = py::array_t<double>(py::ssize_t(r.wait_us.size()), r.wait_us.data());
        return d;
      },
      py::arg("method"), py::arg("iterations") = 1000, py::arg("work_us") = 200.0,
      py::arg("predicted_us") = -1.0, py::arg("sleep_margin_us") = 100.0, py::arg("warmup") = 20,
      "Two threads hand work over: a device thread busy-works work_us and raises a flag, this "
      "thread waits by `method` (condvar, futex, spin, sleep-poll: sleep predicted_us - margin, "
      "then poll; predicted_us < 0 = work_us). Per handoff: latency_us (flag raised -> seen), "
      "waiter_cpu_us (this thread's CPU time in the wait), wait_us (handoff.h).");
}

}  // namespace socllm::py_bind
