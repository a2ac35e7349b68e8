// write_model(): parallel, ordered, bounded-memory generation of a kestrel-mkmodel GGUF.
#include "tools/mkmodel/model_writer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "tools/mkmodel/block_generator.h"
#include "tools/mkmodel/model_metadata.h"
#include "tools/mkmodel/progress_meter.h"

namespace kestrel::mkmodel {

namespace {

struct Job {
  size_t tensor = 0;
  uint64_t first_block = 0;
  uint64_t n_blocks = 0;
};

struct Slot {
  std::vector<uint8_t> data;
  size_t job = SIZE_MAX;  // the job whose bytes `data` holds
};

// Cuts every tensor into chunks of at most chunk_bytes (whole blocks, at least one block).
std::vector<Job> make_jobs(const std::vector<BlockGenerator>& gens, const ModelPlan& plan, uint64_t chunk_bytes) {
  std::vector<Job> jobs;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const uint64_t n_blocks = plan.tensors[t].n_elements / gens[t].block_elems();
    const uint64_t per_chunk = std::max<uint64_t>(1, chunk_bytes / gens[t].block_bytes());
    for (uint64_t b = 0; b < n_blocks; b += per_chunk) jobs.push_back(Job{t, b, std::min(per_chunk, n_blocks - b)});
  }
  return jobs;
}

// The ring: workers fill slot j % size for job j once job j - size has been written; the writer consumes in order.
class OrderedPipeline {
 public:
  OrderedPipeline(const std::vector<BlockGenerator>& gens, const std::vector<Job>& jobs, size_t n_slots)
      : gens_(gens), jobs_(jobs), slots_(n_slots) {}

  void worker() {
    for (;;) {
      size_t j = 0;
      {
        std::unique_lock lock(mu_);
        cv_free_.wait(lock, [&] { return abort_ || next_ >= jobs_.size() || next_ < written_ + slots_.size(); });
        if (abort_ || next_ >= jobs_.size()) return;
        j = next_++;
      }
      const Job& job = jobs_[j];
      const BlockGenerator& g = gens_[job.tensor];
      Slot& slot = slots_[j % slots_.size()];
      slot.data.resize(job.n_blocks * g.block_bytes());
      g.generate(job.first_block, job.n_blocks, slot.data.data());
      {
        std::lock_guard lock(mu_);
        slot.job = j;
      }
      cv_ready_.notify_all();
    }
  }

  // Blocks until job j is generated; the span stays valid until release(j).
  std::span<const uint8_t> acquire(size_t j) {
    std::unique_lock lock(mu_);
    Slot& slot = slots_[j % slots_.size()];
    cv_ready_.wait(lock, [&] { return slot.job == j; });
    return slot.data;
  }

  void release(size_t j) {
    {
      std::lock_guard lock(mu_);
      written_ = j + 1;
    }
    cv_free_.notify_all();
  }

  void abort() {
    {
      std::lock_guard lock(mu_);
      abort_ = true;
    }
    cv_free_.notify_all();
  }

 private:
  const std::vector<BlockGenerator>& gens_;
  const std::vector<Job>& jobs_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_free_;
  std::condition_variable cv_ready_;
  size_t next_ = 0;     // next job to hand to a worker
  size_t written_ = 0;  // jobs written so far
  bool abort_ = false;
};

}  // namespace

Expected<WriteStats> write_model(const ModelPlan& plan, const std::string& path, const MetadataHook& extra_metadata,
                                 const WriteOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<BlockGenerator> gens;
  gens.reserve(plan.tensors.size());
  for (const PlannedTensor& t : plan.tensors) {
    auto g = BlockGenerator::create(t.type, t.init, tensor_stream_key(plan.options.seed, t.spec.name));
    if (!g) return make_error(g.error().code, t.spec.name + ": " + g.error().message);
    gens.push_back(*g);
  }

  KESTREL_TRY_ASSIGN(GgufWriter writer, GgufWriter::create(path));
  KESTREL_TRY(add_model_metadata(writer, plan));
  if (extra_metadata) KESTREL_TRY(extra_metadata(writer));
  for (const PlannedTensor& t : plan.tensors) KESTREL_TRY(writer.add_tensor(t.spec.name, t.spec.ne, t.type));
  KESTREL_TRY(writer.write_header());

  const unsigned threads = options.threads ? options.threads : std::max(2u, std::thread::hardware_concurrency());
  const std::vector<Job> jobs = make_jobs(gens, plan, options.chunk_bytes);
  OrderedPipeline pipeline(gens, jobs, 2 * static_cast<size_t>(threads));
  ProgressMeter progress(writer.total_bytes(), options.progress);

  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers.emplace_back([&pipeline] { pipeline.worker(); });

  Status status = ok_status();
  for (size_t j = 0; j < jobs.size(); ++j) {
    status = writer.append_tensor_data(pipeline.acquire(j));
    if (!status) break;
    pipeline.release(j);
    progress.update(writer.bytes_written());
  }
  pipeline.abort();  // wakes workers waiting for a free slot; a no-op for those that finished
  for (std::thread& w : workers) w.join();
  KESTREL_TRY(std::move(status));
  KESTREL_TRY(writer.finish());
  progress.finish(writer.total_bytes());
  return WriteStats{writer.total_bytes(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

}  // namespace kestrel::mkmodel
