#pragma once

#include <cstdint>
#include <string_view>

#include "runtime/core/error.hpp"

namespace stitch {

/// The engine a replica drives (`engine.kind`): the built-in engine, or an
/// external SGLang or vLLM server behind the same Engine port.
enum class engine_kind : uint8_t { builtin, sglang, vllm };

/// "builtin", "sglang" or "vllm".
std::string_view to_string(engine_kind k) noexcept;
/// Parses what `to_string` prints; anything else is `invalid_argument`
/// naming the value.
result<engine_kind> parse_engine_kind(std::string_view text);

/// Where the built-in engine computes (`engine.device`).
enum class engine_device : uint8_t { cpu, cuda };

/// "cpu" or "cuda".
std::string_view to_string(engine_device d) noexcept;
/// Parses "cpu" / "cuda"; the error names the value.
result<engine_device> parse_engine_device(std::string_view text);

} // namespace stitch
