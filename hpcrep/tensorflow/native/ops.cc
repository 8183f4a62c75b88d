// The TensorFlow ops and their kernels.
//
// HpcrepAllreduceStart (stateful, synchronous, cheap) packs its inputs into one 64-byte-aligned
// buffer, folding in the pre-scale, queues it on its engine and returns a handle. tf.function's
// automatic control dependencies keep stateful ops in program order, so every rank queues its
// requests in the same order. HpcrepAllreduceWait (asynchronous) returns the reduced buffer once
// the engine has finished it; it does not hold a TensorFlow thread while waiting, so the backward
// pass goes on computing while gradients travel.

#include <chrono>
#include <cstring>
#include <thread>

#include "engine.h"
#include "kernels.h"
#include "registry.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hpcrep {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::TensorShape;

class StartOp : public OpKernel {
 public:
  explicit StartOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("engine", &engine_));
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &kind_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_bits", &pre_bits_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_bits", &post_bits_));
    OP_REQUIRES_OK(c, c->GetAttr("signature", &signature_));
    OP_REQUIRES_OK(c, c->GetAttr("description", &description_));
    OP_REQUIRES_OK(c, c->GetAttr("chunk_bytes", &chunk_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr("fusion_bytes", &fusion_bytes_));
    OP_REQUIRES_OK(c, c->GetAttr("tuned", &tuned_));
    std::string match_name;
    OP_REQUIRES_OK(c, c->GetAttr("match_name", &match_name));
    // The name the engine matches requests by when ranks queue them in different orders: the
    // caller's (name= and bucket), else this node's name, which a graph built by the same
    // program gives the same tensor on every rank. FNV-1a, the same on every rank.
    const std::string& key = match_name.empty() ? name() : match_name;
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
    name_key_ = static_cast<int64_t>(h);
    OP_REQUIRES(c, kind_ >= 0 && kind_ < kReduceKinds && kind_ != 2,
                tensorflow::errors::InvalidArgument("hpcrep: unsupported reduce_op ", kind_,
                                                    "; use a value of hpcrep.comm.ops.ReduceOp "
                                                    "other than Adasum"));
  }

  // Cheap (a copy into the request's buffer): the executor runs it inline, in the thread that
  // produced its last input, instead of queueing it on the inter-op pool, so a bucket is handed
  // to the communication thread as soon as its gradients exist.
  bool IsExpensive() override { return false; }

  void Compute(OpKernelContext* ctx) override {
    const int64_t op_start = StampIfOn();
    Engine* engine = FindEngine(engine_);
    OP_REQUIRES(ctx, engine != nullptr,
                EngineError(ErrorKind::kFreed,
                            "hpcrep: this allreduce belongs to a communicator that has been freed "
                            "(hpcrep shut down, or its process set was removed); trace the "
                            "function again after hpcrep.init()"));
    const TypeInfo& info = Info(dtype_);
    auto request = std::make_shared<Request>();
    request->dtype = dtype_;
    request->kind = kind_;
    double pre;
    std::memcpy(&pre, &pre_bits_, sizeof(double));
    std::memcpy(&request->postscale, &post_bits_, sizeof(double));
    const Scaling scaling(dtype_, kind_, engine->size(), pre, 1.0);
    int64_t length = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i)
      length += Padded(ctx->input(i).NumElements(), info.itemsize);
    request->length = length;
    // Describe the request by its inputs' shapes as well as the traced signature, so that two
    // ranks whose dynamic shapes differ do not pass the check. Every dimension counts, not
    // only the element count: [2, 3] against [3, 2] is a mismatch.
    uint64_t sig = static_cast<uint64_t>(signature_);
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const TensorShape& shape = ctx->input(i).shape();
      sig = (sig * 1000003ull) ^ static_cast<uint64_t>(shape.dims());
      for (int d = 0; d < shape.dims(); ++d)
        sig = (sig * 1000003ull) ^ static_cast<uint64_t>(shape.dim_size(d));
    }
    request->signature = static_cast<int64_t>(sig);
    request->name_key = name_key_;
    request->description = description_;
    if (tuned_) {  // autotune: what the engine was last told (Engine::Tune)
      request->chunk_bytes = engine->TunedChunk();
      request->fusion_bytes = engine->TunedFusion();
      request->half_wire = dtype_ == tensorflow::DT_FLOAT && engine->TunedHalf();
    } else {
      request->chunk_bytes = chunk_bytes_;
      request->fusion_bytes = fusion_bytes_ >= 0 ? fusion_bytes_ : engine->settings().fusion_bytes;
    }
    request->spin_micros = engine->settings().spin_micros;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtype_, TensorShape({length}), &request->buffer));
    char* base = static_cast<char*>(request->buffer.data());
    int64_t offset = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const tensorflow::Tensor& t = ctx->input(i);
      int64_t n = t.NumElements();
      scaling.Before(t.data(), base + offset * info.itemsize, n);
      int64_t padded = Padded(n, info.itemsize);
      if (padded > n)
        std::memset(base + (offset + n) * info.itemsize, 0, (padded - n) * info.itemsize);
      offset += padded;
    }
    int64_t handle = AddRequest(request);
    if (op_start != 0) {
      request->id = handle;
      request->engine = engine_;
      request->stamps[kOpStart] = op_start;
      request->stamps[kEnqueued] = NowNs();
    }
    engine->Enqueue(request);
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = handle;
  }

 private:
  DataType dtype_;
  int64_t engine_;
  int kind_;
  int64_t pre_bits_, post_bits_, signature_;
  std::string description_;
  int64_t chunk_bytes_ = 0;
  int64_t fusion_bytes_ = -1;
  bool tuned_ = false;
  int64_t name_key_ = 0;
};

class WaitOp : public AsyncOpKernel {
 public:
  explicit WaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int64_t handle = ctx->input(0).scalar<int64_t>()();
    std::shared_ptr<Request> request = TakeRequest(handle);
    OP_REQUIRES_ASYNC(ctx, request != nullptr,
                      tensorflow::errors::Internal("hpcrep: unknown allreduce handle ", handle),
                      done);
    auto finish = [ctx, request, done]() {
      if (!request->status.ok()) {
        ctx->SetStatus(request->status);
      } else {
        ctx->set_output(0, request->buffer);
      }
      // Recorded before done(): once TensorFlow has the result, the step (and the timeline's
      // drain at its end or at exit) may come before a record written after it.
      const bool stamped = request->stamps[kOpStart] != 0;
      if (stamped) {
        request->stamps[kReturned] = NowNs();
        RecordRequest(*request);
      }
      done();
    };
    // A small allreduce is often done within microseconds: finishing here, on this thread,
    // spares TensorFlow a wake-up from the communication thread.
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::microseconds(request->spin_micros / 2);
    while (!request->finished.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lock(request->mu);
      if (!request->finished.load()) {
        request->on_finish = finish;
        return;
      }
    }
    finish();
  }
};


// Passes its values through, or fails with the TensorFlow status a host call reported as
// (code, message). TensorFlow turns an exception raised inside tf.numpy_function into an error
// chosen by its Python base class only, so a collective run on the host could not raise
// Horovod's error types (FailedPreconditionError for a mismatch) outside eager mode; the host
// call returns its error as data instead, and this op raises it. Stateful, so that
// tf.function runs it even when nothing uses the values.
class CheckHostStatusOp : public OpKernel {
 public:
  explicit CheckHostStatusOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* c) override {
    const int32_t code = c->input(0).scalar<int32_t>()();
    if (code != 0) {
      c->SetStatus(absl::Status(static_cast<absl::StatusCode>(code),
                                std::string(c->input(1).scalar<tensorflow::tstring>()())));
      return;
    }
    for (int i = 2; i < c->num_inputs(); ++i) c->set_output(i - 2, c->input(i));
  }
};

}  // namespace hpcrep

REGISTER_OP("HpcrepAllreduceStart")
    .Input("tensors: N * T")
    .Output("handle: int64")
    .Attr("T: {float, double, int32, int64, half, bfloat16}")
    .Attr("N: int >= 1")
    .Attr("engine: int")
    .Attr("reduce_op: int")  // a value of hpcrep.comm.ops.ReduceOp (ReduceKind in common.h)
    .Attr("prescale_bits: int")
    .Attr("postscale_bits: int")
    .Attr("signature: int")
    .Attr("description: string")
    .Attr("chunk_bytes: int = 0")  // HPCREP_ALLREDUCE_CHUNK when the function traced
    .Attr("fusion_bytes: int = -1")  // HPCREP_FUSION_THRESHOLD then; -1: the engine's setting
    .Attr("tuned: bool = false")  // take both from the engine's autotuner instead (Engine::Tune)
    .Attr("match_name: string = ''")  // what ranks match by (engine.h); '': the node's name
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("HpcrepAllreduceWait")
    .Input("handle: int64")
    .Output("buffer: T")
    .Attr("T: {float, double, int32, int64, half, bfloat16}")
    .Attr("length: int = -1")  // the buffer's length when known at trace time, else -1
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t length;
      TF_RETURN_IF_ERROR(c->GetAttr("length", &length));
      c->set_output(0, c->Vector(length >= 0 ? c->MakeDim(length) : c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HpcrepAllreduceStart").Device(tensorflow::DEVICE_CPU),
                        hpcrep::StartOp);
REGISTER_KERNEL_BUILDER(Name("HpcrepAllreduceWait").Device(tensorflow::DEVICE_CPU),
                        hpcrep::WaitOp);

REGISTER_OP("HpcrepCheckHostStatus")
    .Input("code: int32")
    .Input("message: string")
    .Input("values: T")
    .Output("out: T")
    .Attr("T: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 2; i < c->num_inputs(); ++i) c->set_output(i - 2, c->input(i));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HpcrepCheckHostStatus").Device(tensorflow::DEVICE_CPU),
                        hpcrep::CheckHostStatusOp);
