#include "codec.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "plexus/base/byte_order.hpp"
#include "plexus/base/status.hpp"

namespace plexus::rpc::internal {

static_assert(std::endian::native == std::endian::little,
              "the rpc wire format is little-endian and mapped in place");

size_t ScalarSize(FieldKind kind) {
  switch (kind) {
    case FieldKind::kBool:
      return 1;
    case FieldKind::kInt32:
    case FieldKind::kUInt32:
    case FieldKind::kFloat:
    case FieldKind::kEnum:
      return 4;
    case FieldKind::kInt64:
    case FieldKind::kUInt64:
    case FieldKind::kDouble:
      return 8;
    default:
      return 0;
  }
}

void EncodedMessage::Clear() {
  structure.clear();
  parts.clear();
  segment_first.clear();
  segment_parts.clear();
  segment_bytes.clear();
}

void* Arena::Allocate(size_t bytes, size_t align) {
  if (bytes == 0) bytes = 1;
  size_t pad = (align - reinterpret_cast<uintptr_t>(cursor_) % align) % align;
  if (pad + bytes > left_) {
    size_t block = std::max<size_t>(bytes + align, 4096);
    if (used_ + block > limit_) return nullptr;
    // Not zeroed: the decoder writes every byte it hands out (a 4 KiB memset per message was a
    // measurable share of a small call).
    blocks_.push_back(std::make_unique_for_overwrite<unsigned char[]>(block));
    used_ += block;
    cursor_ = blocks_.back().get();
    left_ = block;
    pad = (align - reinterpret_cast<uintptr_t>(cursor_) % align) % align;
  }
  void* p = cursor_ + pad;
  cursor_ += pad + bytes;
  left_ -= pad + bytes;
  return p;
}

namespace {

bool IsView(const FieldDesc& f) {
  return f.label == FieldLabel::kRepeated || f.kind == FieldKind::kString ||
         f.kind == FieldKind::kBytes || f.kind == FieldKind::kMessage;
}

template <typename T>
void Put(std::string& s, T v) {
  base::AppendLittleEndian(s, v);
}

class Encoder {
 public:
  Encoder(EncodedMessage* out, const CodecLimits& limits) : out_(out), limits_(limits) {}

  absl::Status Message(const MessageDesc& desc, const void* msg, int depth) {
    if (depth > limits_.max_depth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", desc.full_name, " nests deeper than ", limits_.max_depth, " levels"));
    }
    Put<uint16_t>(out_->structure, static_cast<uint16_t>(desc.field_count));
    void* m = const_cast<void*>(msg);
    for (size_t i = 0; i < desc.field_count; ++i) {
      const FieldDesc& f = desc.fields[i];
      if (!IsView(f)) {
        if (f.label == FieldLabel::kOptional) {
          bool has = *f.has(m);
          Put<uint8_t>(out_->structure, has ? 1 : 0);
          if (!has) continue;
        }
        const size_t n = ScalarSize(f.kind);
        if (f.kind == FieldKind::kBool) {
          Put<uint8_t>(out_->structure, *static_cast<const bool*>(f.value(m)) ? 1 : 0);
        } else {
          out_->structure.append(static_cast<const char*>(f.value(m)), n);
        }
        continue;
      }
      const void* data = nullptr;
      size_t count = 0;
      f.get_view(msg, &data, &count);
      if (f.kind == FieldKind::kMessage) {
        const MessageDesc& sub = *f.message();
        if (f.label != FieldLabel::kRepeated) {
          Put<uint8_t>(out_->structure, data != nullptr ? 1 : 0);
          if (data != nullptr) PLEXUS_RETURN_IF_ERROR(Message(sub, data, depth + 1));
          continue;
        }
        PLEXUS_RETURN_IF_ERROR(Count(f, count));
        Put<uint32_t>(out_->structure, static_cast<uint32_t>(count));
        for (size_t k = 0; k < count; ++k) {
          PLEXUS_RETURN_IF_ERROR(
              Message(sub, static_cast<const char*>(data) + k * sub.size, depth + 1));
        }
        continue;
      }
      if (f.label == FieldLabel::kOptional) {
        bool has = *f.has(m);
        Put<uint8_t>(out_->structure, has ? 1 : 0);
        if (!has) continue;
      }
      if (f.label == FieldLabel::kRepeated &&
          (f.kind == FieldKind::kString || f.kind == FieldKind::kBytes)) {
        // Both std::string_view and Bytes are (pointer, size) pairs read through their API.
        PLEXUS_RETURN_IF_ERROR(Count(f, count));
        Put<uint32_t>(out_->structure, static_cast<uint32_t>(count));
        const size_t first = out_->parts.size();
        uint64_t total = 0;
        for (size_t k = 0; k < count; ++k) {
          const void* p;
          size_t len;
          if (f.kind == FieldKind::kString) {
            auto sv = static_cast<const std::string_view*>(data)[k];
            p = sv.data();
            len = sv.size();
          } else {
            auto b = static_cast<const Bytes*>(data)[k];
            p = b.data();
            len = b.size();
          }
          PLEXUS_RETURN_IF_ERROR(Count(f, len));
          Put<uint32_t>(out_->structure, static_cast<uint32_t>(len));
          if (len > 0) out_->parts.push_back({p, len});
          total += len;
        }
        if (total > 0) AddSegment(first, out_->parts.size() - first, total);
        continue;
      }
      // A string, bytes or repeated scalar: one segment of raw bytes.
      const size_t bytes = f.label == FieldLabel::kRepeated ? count * ScalarSize(f.kind) : count;
      PLEXUS_RETURN_IF_ERROR(Count(f, bytes));
      Put<uint32_t>(out_->structure, static_cast<uint32_t>(bytes));
      if (bytes > 0) {
        out_->parts.push_back({data, bytes});
        AddSegment(out_->parts.size() - 1, 1, bytes);
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Count(const FieldDesc& f, size_t n) {
    if (n > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", f.name, " holds ", n, " items/bytes, over the 2^32-1 limit"));
    }
    return absl::OkStatus();
  }
  void AddSegment(size_t first, size_t parts, uint64_t bytes) {
    out_->segment_first.push_back(static_cast<uint32_t>(first));
    out_->segment_parts.push_back(static_cast<uint32_t>(parts));
    out_->segment_bytes.push_back(bytes);
  }

  EncodedMessage* out_;
  const CodecLimits& limits_;
};

// A field's path ("kv.PutRequest.entries[2].key"), spelled out only for an error message: a
// decode that succeeds builds no string (it used to build one per field, per call).
struct FieldPath {
  const FieldPath* parent = nullptr;
  const char* name = "";  // appended after a '.' (the root: the message's full name)
  int64_t index = -1;     // >= 0: an element "[index]" of the parent
  std::string Str() const {
    std::string out = parent ? parent->Str() : std::string();
    if (index >= 0) {
      absl::StrAppend(&out, "[", index, "]");
    } else {
      absl::StrAppend(&out, parent ? "." : "", name);
    }
    return out;
  }
};

class Decoder {
 public:
  Decoder(absl::Span<const uint8_t> structure, absl::Span<const absl::Span<const uint8_t>> segments,
          Arena& arena, const CodecLimits& limits)
      : s_(structure), segments_(segments), arena_(arena), limits_(limits) {}

  absl::Status Message(const MessageDesc& desc, void* m, int depth, const FieldPath& path) {
    if (depth > limits_.max_depth) {
      return Error(path, absl::StrCat("nests deeper than ", limits_.max_depth, " levels"));
    }
    uint16_t fields;
    if (!Read(&fields, sizeof fields)) return Truncated(path);
    if (fields != desc.field_count) {
      return Error(path, absl::StrCat("has ", fields, " fields on the wire, the schema ",
                                      desc.field_count, " (", desc.full_name, ")"));
    }
    for (size_t i = 0; i < desc.field_count; ++i) {
      const FieldDesc& f = desc.fields[i];
      const FieldPath fpath{&path, f.name};
      if (f.label == FieldLabel::kOptional && f.kind != FieldKind::kMessage) {
        uint8_t has;
        if (!Read(&has, 1)) return Truncated(fpath);
        if (has > 1) return Error(fpath, absl::StrCat("presence byte is ", has, ", not 0 or 1"));
        *f.has(m) = has == 1;
        if (!has) continue;
      }
      if (!IsView(f)) {
        PLEXUS_RETURN_IF_ERROR(Scalar(f, f.value(m), fpath));
        continue;
      }
      if (f.kind == FieldKind::kMessage) {
        const MessageDesc& sub = *f.message();
        if (f.label != FieldLabel::kRepeated) {
          uint8_t present;
          if (!Read(&present, 1)) return Truncated(fpath);
          if (present > 1) {
            return Error(fpath, absl::StrCat("presence byte is ", present, ", not 0 or 1"));
          }
          if (!present) continue;
          PLEXUS_ASSIGN_OR_RETURN(void* obj, New(sub, 1, fpath));
          PLEXUS_RETURN_IF_ERROR(Message(sub, obj, depth + 1, fpath));
          f.set_view(m, obj, 1);
          continue;
        }
        uint32_t count;
        if (!Read(&count, sizeof count)) return Truncated(fpath);
        // Every record takes at least its 2-byte field count: bounds the allocation below.
        if (count > (s_.size() - pos_) / 2) {
          return Error(fpath, absl::StrCat("count ", count, " exceeds what the remaining ",
                                           s_.size() - pos_, " structure bytes can hold"));
        }
        PLEXUS_ASSIGN_OR_RETURN(void* arr, New(sub, count, fpath));
        for (uint32_t k = 0; k < count; ++k) {
          PLEXUS_RETURN_IF_ERROR(Message(sub, static_cast<char*>(arr) + k * sub.size, depth + 1,
                                         FieldPath{&fpath, "", static_cast<int64_t>(k)}));
        }
        f.set_view(m, count ? arr : nullptr, count);
        continue;
      }
      if (f.label == FieldLabel::kRepeated &&
          (f.kind == FieldKind::kString || f.kind == FieldKind::kBytes)) {
        PLEXUS_RETURN_IF_ERROR(RepeatedStrings(f, m, fpath));
        continue;
      }
      uint32_t bytes;
      if (!Read(&bytes, sizeof bytes)) return Truncated(fpath);
      absl::Span<const uint8_t> seg;
      if (bytes > 0) {
        PLEXUS_ASSIGN_OR_RETURN(seg, Segment(bytes, fpath));
      }
      if (f.label != FieldLabel::kRepeated) {
        f.set_view(m, seg.data(), seg.size());
        continue;
      }
      const size_t es = ScalarSize(f.kind);
      if (bytes % es != 0) {
        return Error(
            fpath, absl::StrCat(bytes, " bytes are not a whole number of ", es, "-byte elements"));
      }
      const size_t count = bytes / es;
      if (f.kind == FieldKind::kBool || f.kind == FieldKind::kEnum) {
        for (size_t k = 0; k < count; ++k) {
          PLEXUS_RETURN_IF_ERROR(
              Check(f, seg.data() + k * es, FieldPath{&fpath, "", static_cast<int64_t>(k)}));
        }
      }
      f.set_view(m, count ? seg.data() : nullptr, count);
    }
    return absl::OkStatus();
  }

  absl::Status Finish(const MessageDesc& desc) {
    if (pos_ != s_.size()) {
      return Error(FieldPath{nullptr, desc.full_name},
                   absl::StrCat("has ", s_.size() - pos_, " trailing structure bytes"));
    }
    if (next_segment_ != segments_.size()) {
      return Error(FieldPath{nullptr, desc.full_name},
                   absl::StrCat("uses ", next_segment_, " of the ", segments_.size(),
                                " data segments sent"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<void*> New(const MessageDesc& desc, size_t count, const FieldPath& path) {
    void* p = arena_.Allocate(desc.size * count, desc.align);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("field ", path.Str(), ": decoding exceeds the ", limits_.max_arena_bytes,
                       "-byte limit of one message"));
    }
    for (size_t k = 0; k < count; ++k) desc.construct(static_cast<char*>(p) + k * desc.size);
    return p;
  }

 private:
  bool Read(void* out, size_t n) {
    if (s_.size() - pos_ < n) return false;
    std::memcpy(out, s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  static absl::Status Error(const FieldPath& path, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: field ", path.Str(), " ", what));
  }
  static absl::Status Truncated(const FieldPath& path) {
    return Error(path, "is cut off (the structure segment ends inside it)");
  }
  absl::StatusOr<absl::Span<const uint8_t>> Segment(uint64_t bytes, const FieldPath& path) {
    if (next_segment_ >= segments_.size()) {
      return Error(path, absl::StrCat("needs data segment ", next_segment_ + 1, " but only ",
                                      segments_.size(), " were sent"));
    }
    auto seg = segments_[next_segment_];
    if (seg.size() != bytes) {
      return Error(path, absl::StrCat("says ", bytes, " bytes but its data segment ",
                                      next_segment_ + 1, " has ", seg.size()));
    }
    ++next_segment_;
    return seg;
  }
  absl::Status Check(const FieldDesc& f, const void* p, const FieldPath& path) {
    if (f.kind == FieldKind::kBool) {
      uint8_t b;
      std::memcpy(&b, p, 1);
      if (b > 1) return Error(path, absl::StrCat("is a bool holding ", b));
    } else if (f.kind == FieldKind::kEnum) {
      int32_t v;
      std::memcpy(&v, p, 4);
      const EnumDesc& e = *f.enumeration();
      if (!std::binary_search(e.values, e.values + e.value_count, v)) {
        return Error(path, absl::StrCat("holds ", v, ", not a value of enum ", e.full_name));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Scalar(const FieldDesc& f, void* out, const FieldPath& path) {
    const size_t n = ScalarSize(f.kind);
    if (s_.size() - pos_ < n) return Truncated(path);
    PLEXUS_RETURN_IF_ERROR(Check(f, s_.data() + pos_, path));
    if (f.kind == FieldKind::kBool) {
      *static_cast<bool*>(out) = s_[pos_] == 1;
    } else {
      std::memcpy(out, s_.data() + pos_, n);
    }
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status RepeatedStrings(const FieldDesc& f, void* m, const FieldPath& path) {
    uint32_t count;
    if (!Read(&count, sizeof count)) return Truncated(path);
    if (count > (s_.size() - pos_) / 4) {
      return Error(path, absl::StrCat("count ", count, " exceeds what the remaining ",
                                      s_.size() - pos_, " structure bytes can hold"));
    }
    const size_t es = f.kind == FieldKind::kString ? sizeof(std::string_view) : sizeof(Bytes);
    void* arr = arena_.Allocate(es * std::max<size_t>(count, 1), alignof(std::string_view));
    if (arr == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("field ", path.Str(), ": decoding exceeds the per-message limit of ",
                       limits_.max_arena_bytes, " bytes"));
    }
    const size_t lengths_at = pos_;
    uint64_t total = 0;
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t len = 0;  // always read: count * 4 bytes remain (checked above)
      Read(&len, sizeof len);
      total += len;
    }
    absl::Span<const uint8_t> seg;
    if (total > 0) {
      PLEXUS_ASSIGN_OR_RETURN(seg, Segment(total, path));
    }
    size_t at = 0;
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t len;
      std::memcpy(&len, s_.data() + lengths_at + 4 * k, 4);
      const uint8_t* p = seg.data() + at;
      if (f.kind == FieldKind::kString) {
        new (static_cast<std::string_view*>(arr) + k)
            std::string_view(reinterpret_cast<const char*>(p), len);
      } else {
        new (static_cast<Bytes*>(arr) + k) Bytes(p, len);
      }
      at += len;
    }
    f.set_view(m, count ? arr : nullptr, count);
    return absl::OkStatus();
  }

  absl::Span<const uint8_t> s_;
  size_t pos_ = 0;
  absl::Span<const absl::Span<const uint8_t>> segments_;
  size_t next_segment_ = 0;
  Arena& arena_;
  const CodecLimits& limits_;
};

}  // namespace

absl::Status EncodeMessage(const MessageDesc& desc, const void* msg, EncodedMessage* out,
                           const CodecLimits& limits) {
  Encoder e(out, limits);
  return e.Message(desc, msg, 0);
}

absl::StatusOr<void*> DecodeMessage(const MessageDesc& desc, absl::Span<const uint8_t> structure,
                                    absl::Span<const absl::Span<const uint8_t>> segments,
                                    Arena& arena, const CodecLimits& limits) {
  Decoder d(structure, segments, arena, limits);
  const FieldPath root{nullptr, desc.full_name};
  PLEXUS_ASSIGN_OR_RETURN(void* msg, d.New(desc, 1, root));
  PLEXUS_RETURN_IF_ERROR(d.Message(desc, msg, 0, root));
  PLEXUS_RETURN_IF_ERROR(d.Finish(desc));
  return msg;
}

}  // namespace plexus::rpc::internal
