// vLLM's runtime LoRA updating: POST /v1/load_lora_adapter {"lora_name", "lora_path"} and
// /v1/unload_lora_adapter {"lora_name"}, served when ServerOptions::runtime_lora is on (vLLM's
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). An adapter loaded so is served as its own model name at
// once, and joins the trajectories the other agents write: its first request reads their cache.
#include <algorithm>
#include <future>

#include <fmt/format.h>

#include "server/server_internal.h"

namespace lragent::server {

using namespace routes;

Status Server::on_engine(std::function<Status()> task) {
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> result = done->get_future();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    // The engine thread runs every task queued before it was told to stop.
    if (stopping_) return make_error(ErrorCode::kInternal, "the server is shutting down");
    tasks_.push_back([task = std::move(task), done] {
      try {
        done->set_value(task());
      } catch (const std::exception& e) {
        done->set_value(make_error(ErrorCode::kInternal, "internal error: {}", e.what()));
      }
    });
  }
  queue_cv_.notify_all();
  return result.get();
}

Status Server::load_adapter(const std::string& name, const std::string& dir, bool replace) {
  auto served = [&] {
    const std::vector<std::string> names = model_names();
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  if (is_base_name(name))
    return make_error(ErrorCode::kInvalidArgument, "'{}' is a served name of the base model: give the adapter another",
                      name);
  const char* loaded = "the LoRA adapter '{}' has already been loaded: unload it first, load this one as another name, "
                       "or give \"load_inplace\": true";
  if (!replace && served()) return make_error(ErrorCode::kInvalidArgument, fmt::runtime(loaded), name);
  // Read and checked here, off the engine thread: only placing it on the device runs between passes.
  LRA_ASSIGN_OR_RETURN(std::unique_ptr<LoraAdapter> adapter, load_lora_adapter(name, dir, model_->config()));
  if (opts_.max_lora_rank > 0 && adapter->max_rank() > opts_.max_lora_rank)
    return make_error(ErrorCode::kInvalidArgument,
                      "adapter '{}' ({}) has LoRA rank {}, more than --max-lora-rank {}: restart the server with a "
                      "higher one",
                      name, dir, adapter->max_rank(), opts_.max_lora_rank);
  auto holder = std::make_shared<std::unique_ptr<LoraAdapter>>(std::move(adapter));
  return on_engine([this, holder, name, replace, loaded, &served]() -> Status {
    if (!replace && served()) return make_error(ErrorCode::kInvalidArgument, fmt::runtime(loaded), name);
    LRA_RETURN_IF_ERROR(upload_adapter(**holder, model_->backend()));
    // Replaced only now: an adapter that cannot be read or placed leaves the served one as it was.
    if (replace && registry_->find(name)) LRA_RETURN_IF_ERROR(retire(name));
    LRA_RETURN_IF_ERROR(registry_->add(std::move(*holder)));
    const LoraAdapter* added = registry_->find(name);
    if (Status st = pool_->add_agent(name, added); !st.ok()) {
      (void)registry_->remove(name);  // no trajectory took it: freed here
      return st;
    }
    {
      std::lock_guard<std::mutex> lock(names_mu_);
      names_.push_back(name);
      roots_.push_back(added->dir);
    }
    publish_sessions();
    return Status::Ok();
  });
}

Status Server::unload_adapter(const std::string& name) {
  if (is_base_name(name))
    return make_error(ErrorCode::kInvalidArgument, "'{}' is the base model, not an adapter: it cannot be unloaded", name);
  return on_engine([this, name]() -> Status {
    if (!registry_->find(name))
      return make_error(ErrorCode::kNotFound, "the LoRA adapter '{}' cannot be found: GET /v1/models lists those served",
                        name);
    return retire(name);
  });
}

Status Server::retire(const std::string& name) {
  LRA_RETURN_IF_ERROR(pool_->remove_agent(name));
  {
    std::lock_guard<std::mutex> lock(names_mu_);
    const auto at = std::find(names_.begin(), names_.end(), name);
    if (at != names_.end()) {
      roots_.erase(roots_.begin() + (at - names_.begin()));
      names_.erase(at);
    }
  }
  retired_.push_back(registry_->remove(name));
  free_retired();
  publish_sessions();
  return Status::Ok();
}

void Server::free_retired() {
  auto unheld = [&](const std::unique_ptr<LoraAdapter>& a) { return !pool_->holds(a.get()); };
  if (std::any_of(retired_.begin(), retired_.end(), unheld)) {
    // A pass launched ahead of its results (decode lookahead) may still read the weights.
    model_->backend().synchronize();
    std::erase_if(retired_, unheld);
  }
  std::lock_guard<std::mutex> lock(queue_mu_);
  retired_count_ = retired_.size();
}

void Server::install_lora_routes() {
  httplib::Server& svr = http_->svr;
  // Off, the routes answer as absent ones do, saying how to turn them on.
  auto off = [](httplib::Response& res) {
    send_error(res, Error{ErrorCode::kNotFound,
                          "loading and unloading LoRA adapters at run time is off: start the server with "
                          "--enable-runtime-lora (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment)"});
  };
  auto ok = [](httplib::Response& res, const std::string& text) {
    res.status = 200;
    res.set_content(text, "text/plain; charset=utf-8");
  };
  post_route(svr, "/v1/load_lora_adapter", [=, this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    if (!opts_.runtime_lora) return off(res);
    auto r = parse_load_lora_request(body);
    if (!r.ok()) return send_error(res, r.error());
    if (Status st = load_adapter(r->name, r->path, r->inplace); !st.ok()) return send_error(res, st.error());
    ok(res, fmt::format("Success: LoRA adapter '{}' added successfully.", r->name));
  });
  post_route(svr, "/v1/unload_lora_adapter", [=, this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    if (!opts_.runtime_lora) return off(res);
    auto r = parse_unload_lora_request(body);
    if (!r.ok()) return send_error(res, r.error());
    if (Status st = unload_adapter(r->name); !st.ok()) return send_error(res, st.error());
    ok(res, fmt::format("Success: LoRA adapter '{}' removed successfully.", r->name));
  });
}

}  // namespace lragent::server
