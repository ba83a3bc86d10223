// protoc-gen-plexus: generates zero-copy message structs, builders, client stubs and server base
// classes for plexus::rpc from proto3 files (docs/rpc.md). Run by protoc:
//   protoc --plugin=protoc-gen-plexus=<this> --plexus_out=<dir> -I<dir> a.proto
// For a.proto it writes a.plexus.hpp. Features the runtime cannot carry are refused with the
// file:line of the offending declaration.
#include <google/protobuf/compiler/code_generator.h>
#include <google/protobuf/compiler/plugin.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/printer.h>
#include <google/protobuf/io/zero_copy_stream.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace pb = google::protobuf;

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

std::string Namespace(const pb::FileDescriptor* file) {
  return file->package().empty() ? "" : "::" + Replace(file->package(), ".", "::");
}

// Nested types are flattened like protobuf's C++: Outer_Inner.
template <typename D>
std::string LocalName(const D* d) {
  std::string name = d->name();
  for (const pb::Descriptor* p = d->containing_type(); p != nullptr; p = p->containing_type()) {
    name = p->name() + "_" + name;
  }
  return name;
}
template <typename D>
std::string QualifiedName(const D* d) {
  return Namespace(d->file()) + "::" + LocalName(d);
}

std::string FieldName(const pb::FieldDescriptor* f) {
  static const std::set<std::string> kKeywords = {
      "alignas", "and",       "auto",      "bool",     "break",      "case",     "catch",
      "char",    "class",     "const",     "continue", "default",    "delete",   "do",
      "double",  "else",      "enum",      "explicit", "export",     "extern",   "false",
      "float",   "for",       "friend",    "goto",     "if",         "inline",   "int",
      "long",    "mutable",   "namespace", "new",      "not",        "operator", "or",
      "private", "protected", "public",    "register", "return",     "short",    "signed",
      "sizeof",  "static",    "struct",    "switch",   "template",   "this",     "throw",
      "true",    "try",       "typedef",   "union",    "unsigned",   "using",    "virtual",
      "void",    "volatile",  "while",     "xor",      "Descriptor", "Builder"};
  return kKeywords.count(f->name()) ? f->name() + "_" : f->name();
}

std::string Location(const pb::FileDescriptor* file, const pb::SourceLocation* loc, bool ok) {
  return file->name() + ":" + (ok ? std::to_string(loc->start_line + 1) : std::string("?"));
}
template <typename D>
std::string Where(const D* d) {
  pb::SourceLocation loc;
  bool ok = d->GetSourceLocation(&loc);
  return Location(d->file(), &loc, ok);
}

struct Kind {
  std::string kind;   // FieldKind enumerator
  std::string ctype;  // element type
};

Kind KindOf(const pb::FieldDescriptor* f) {
  using T = pb::FieldDescriptor;
  switch (f->type()) {
    case T::TYPE_BOOL:
      return {"kBool", "bool"};
    case T::TYPE_INT32:
    case T::TYPE_SINT32:
    case T::TYPE_SFIXED32:
      return {"kInt32", "int32_t"};
    case T::TYPE_UINT32:
    case T::TYPE_FIXED32:
      return {"kUInt32", "uint32_t"};
    case T::TYPE_INT64:
    case T::TYPE_SINT64:
    case T::TYPE_SFIXED64:
      return {"kInt64", "int64_t"};
    case T::TYPE_UINT64:
    case T::TYPE_FIXED64:
      return {"kUInt64", "uint64_t"};
    case T::TYPE_FLOAT:
      return {"kFloat", "float"};
    case T::TYPE_DOUBLE:
      return {"kDouble", "double"};
    case T::TYPE_ENUM:
      return {"kEnum", QualifiedName(f->enum_type())};
    case T::TYPE_STRING:
      return {"kString", "std::string_view"};
    case T::TYPE_BYTES:
      return {"kBytes", "::plexus::rpc::Bytes"};
    case T::TYPE_MESSAGE:
      return {"kMessage", QualifiedName(f->message_type())};
    default:
      return {"", ""};
  }
}

bool IsOptional(const pb::FieldDescriptor* f) {
  return f->has_optional_keyword() && f->type() != pb::FieldDescriptor::TYPE_MESSAGE;
}

// The C++ member type of a field.
std::string MemberType(const pb::FieldDescriptor* f) {
  Kind k = KindOf(f);
  if (f->is_repeated()) return "::plexus::rpc::Repeated<" + k.ctype + ">";
  if (k.kind == "kMessage") return "const " + k.ctype + "*";
  if (IsOptional(f)) return "::plexus::rpc::Optional<" + k.ctype + ">";
  return k.ctype;
}

std::string Default(const pb::FieldDescriptor* f) {
  if (f->is_repeated() || IsOptional(f)) return "";
  Kind k = KindOf(f);
  if (k.kind == "kMessage") return " = nullptr";
  if (k.kind == "kEnum") return " = static_cast<" + k.ctype + ">(0)";
  if (k.kind == "kString" || k.kind == "kBytes") return "";
  if (k.kind == "kBool") return " = false";
  return " = 0";
}

// Canonical text of every type a service reaches, for the schema hash.
void Canon(const pb::Descriptor* m, std::map<std::string, std::string>* out);
void CanonEnum(const pb::EnumDescriptor* e, std::map<std::string, std::string>* out) {
  std::string s = "enum " + e->full_name() + "{";
  for (int i = 0; i < e->value_count(); ++i) {
    s += e->value(i)->name() + "=" + std::to_string(e->value(i)->number()) + ";";
  }
  (*out)[e->full_name()] = s + "}";
}
void Canon(const pb::Descriptor* m, std::map<std::string, std::string>* out) {
  if (out->count(m->full_name())) return;
  (*out)[m->full_name()] = "";
  std::string s = "message " + m->full_name() + "{";
  for (int i = 0; i < m->field_count(); ++i) {
    const pb::FieldDescriptor* f = m->field(i);
    s += std::to_string(f->number()) + ":" + f->name() + ":" + f->type_name() + ":" +
         (f->is_repeated() ? "repeated"
          : IsOptional(f)  ? "optional"
                           : "singular");
    if (f->message_type()) {
      s += ":" + f->message_type()->full_name();
      Canon(f->message_type(), out);
    }
    if (f->enum_type()) {
      s += ":" + f->enum_type()->full_name();
      CanonEnum(f->enum_type(), out);
    }
    s += ";";
  }
  (*out)[m->full_name()] = s + "}";
}

uint64_t Fnv64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

class Generator : public pb::compiler::CodeGenerator {
 public:
  uint64_t GetSupportedFeatures() const override { return FEATURE_PROTO3_OPTIONAL; }

  bool Generate(const pb::FileDescriptor* file, const std::string& parameter,
                pb::compiler::GeneratorContext* context, std::string* error) const override {
    (void)parameter;
    if (!Check(file, error)) return false;
    std::vector<const pb::Descriptor*> messages;
    std::vector<const pb::EnumDescriptor*> enums;
    for (int i = 0; i < file->enum_type_count(); ++i) enums.push_back(file->enum_type(i));
    for (int i = 0; i < file->message_type_count(); ++i) {
      Collect(file->message_type(i), &messages, &enums);
    }
    std::ostringstream o;
    std::string base = file->name();
    if (base.size() > 6 && base.substr(base.size() - 6) == ".proto") {
      base = base.substr(0, base.size() - 6);
    }
    o << "// Generated by protoc-gen-plexus from " << file->name() << ". Do not edit.\n"
      << "#pragma once\n\n#include <cstdint>\n#include <memory>\n#include <string>\n"
      << "#include <string_view>\n#include <vector>\n\n#include \"plexus/rpc/generated.hpp\"\n";
    for (int i = 0; i < file->dependency_count(); ++i) {
      std::string dep = file->dependency(i)->name();
      o << "#include \"" << dep.substr(0, dep.size() - 6) << ".plexus.hpp\"\n";
    }
    std::string ns = Namespace(file);
    o << "\nnamespace " << (ns.empty() ? "" : ns.substr(2)) << " {\n\n";
    for (const auto* e : enums) {
      o << "enum class " << LocalName(e) << " : int32_t {\n";
      for (int i = 0; i < e->value_count(); ++i) {
        o << "  " << e->value(i)->name() << " = " << e->value(i)->number() << ",\n";
      }
      o << "};\n";
      std::set<int32_t> values;
      for (int i = 0; i < e->value_count(); ++i) values.insert(e->value(i)->number());
      o << "inline const ::plexus::rpc::EnumDesc* " << LocalName(e) << "_Descriptor() {\n"
        << "  static const int32_t values[] = {";
      for (int32_t v : values) o << v << ", ";
      o << "};\n  static const ::plexus::rpc::EnumDesc desc{\"" << e->full_name() << "\", values, "
        << values.size() << "};\n  return &desc;\n}\n\n";
    }
    for (const auto* m : messages) {
      o << "struct " << LocalName(m) << ";\nclass " << LocalName(m) << "_Builder;\n";
    }
    o << "\n";
    for (const auto* m : messages) Struct(m, o);
    for (const auto* m : messages) BuilderClass(m, o);
    for (const auto* m : messages) DescriptorFn(m, o);
    for (int i = 0; i < file->service_count(); ++i) Service(file->service(i), o);
    o << "}  // namespace " << (ns.empty() ? "" : ns.substr(2)) << "\n";
    std::unique_ptr<pb::io::ZeroCopyOutputStream> out(context->Open(base + ".plexus.hpp"));
    pb::io::Printer p(out.get(), '\0');
    std::string text = o.str();
    p.PrintRaw(text);
    return true;
  }

 private:
  static void Collect(const pb::Descriptor* m, std::vector<const pb::Descriptor*>* messages,
                      std::vector<const pb::EnumDescriptor*>* enums) {
    messages->push_back(m);
    for (int i = 0; i < m->enum_type_count(); ++i) enums->push_back(m->enum_type(i));
    for (int i = 0; i < m->nested_type_count(); ++i) Collect(m->nested_type(i), messages, enums);
  }

  static bool CheckMessage(const pb::Descriptor* m, std::string* error) {
    if (m->extension_range_count() > 0 || m->extension_count() > 0) {
      *error = Where(m) + ": extensions are not supported by plexus rpc (" + m->full_name() + ")";
      return false;
    }
    for (int i = 0; i < m->nested_type_count(); ++i) {
      const pb::Descriptor* n = m->nested_type(i);
      if (n->options().map_entry()) continue;
      if (!CheckMessage(n, error)) return false;
    }
    for (int i = 0; i < m->field_count(); ++i) {
      const pb::FieldDescriptor* f = m->field(i);
      std::string what;
      if (f->is_map()) {
        what = "map fields are not supported (use a repeated message of key/value pairs)";
      } else if (f->real_containing_oneof() != nullptr) {
        what = "oneof is not supported (use optional fields)";
      } else if (f->type() == pb::FieldDescriptor::TYPE_GROUP) {
        what = "groups are not supported";
      } else if (f->message_type() && f->message_type()->file()->package() == "google.protobuf") {
        what = "well-known types (google.protobuf.*) are not supported";
      }
      if (!what.empty()) {
        *error = Where(f) + ": field " + f->full_name() + ": " + what;
        return false;
      }
    }
    return true;
  }

  static bool Check(const pb::FileDescriptor* file, std::string* error) {
    if (file->syntax() != pb::FileDescriptor::SYNTAX_PROTO3) {
      *error = file->name() + ":1: only proto3 files are supported by plexus rpc";
      return false;
    }
    if (file->extension_count() > 0) {
      *error = Where(file->extension(0)) + ": extensions are not supported by plexus rpc";
      return false;
    }
    for (int i = 0; i < file->message_type_count(); ++i) {
      if (!CheckMessage(file->message_type(i), error)) return false;
    }
    for (int i = 0; i < file->service_count(); ++i) {
      const pb::ServiceDescriptor* s = file->service(i);
      for (int j = 0; j < s->method_count(); ++j) {
        const pb::MethodDescriptor* m = s->method(j);
        if (m->client_streaming() || m->server_streaming()) {
          *error = Where(m) + ": method " + m->full_name() +
                   ": streaming methods are not supported (unary calls only)";
          return false;
        }
      }
    }
    return true;
  }

  static void Struct(const pb::Descriptor* m, std::ostringstream& o) {
    const std::string name = LocalName(m);
    o << "// " << m->full_name() << ": views point to memory the message does not own.\n"
      << "struct " << name << " {\n";
    for (int i = 0; i < m->field_count(); ++i) {
      const auto* f = m->field(i);
      o << "  " << MemberType(f) << " " << FieldName(f) << Default(f) << ";\n";
    }
    for (int i = 0; i < m->nested_type_count(); ++i) {
      o << "  using " << m->nested_type(i)->name() << " = " << LocalName(m->nested_type(i))
        << ";\n";
    }
    for (int i = 0; i < m->enum_type_count(); ++i) {
      o << "  using " << m->enum_type(i)->name() << " = " << LocalName(m->enum_type(i)) << ";\n";
    }
    o << "  using Builder = " << name << "_Builder;\n";
    o << "\n  static const ::plexus::rpc::MessageDesc& Descriptor();\n};\n"
      << "static_assert(std::is_trivially_destructible_v<" << name << ">);\n\n";
  }

  static void BuilderClass(const pb::Descriptor* m, std::ostringstream& o) {
    const std::string name = LocalName(m);
    // The builder owns copies of what it is given and hands out the view struct.
    o << "// Owns copies of the values it is given; message() views them.\n"
      << "class " << name << "_Builder {\n public:\n";
    for (int i = 0; i < m->field_count(); ++i) {
      const auto* f = m->field(i);
      const std::string fn = FieldName(f);
      Kind k = KindOf(f);
      if (f->is_repeated()) {
        if (k.kind == "kString" || k.kind == "kBytes") {
          o << "    " << name << "_Builder& set_" << f->name() << "(std::vector<std::string> v) {\n"
            << "      auto& owned = store_.Keep(std::move(v));\n"
            << "      std::vector<" << k.ctype << "> views;\n"
            << "      for (const auto& s : owned) views.push_back("
            << (k.kind == "kString" ? "std::string_view(s)" : "::plexus::rpc::AsBytes(s)") << ");\n"
            << "      const auto& kept = store_.Keep(std::move(views));\n"
            << "      m_." << fn << " = " << MemberType(f) << "(kept.data(), kept.size());\n"
            << "      return *this;\n    }\n";
        } else if (k.kind == "kBool") {
          o << "    " << name << "_Builder& set_" << f->name() << "(std::vector<bool> v) {\n"
            << "      const auto& kept = store_.Keep(std::shared_ptr<bool[]>(new "
               "bool[v.size()]));\n"
            << "      for (size_t i = 0; i < v.size(); ++i) kept[i] = v[i];\n"
            << "      m_." << fn << " = " << MemberType(f) << "(kept.get(), v.size());\n"
            << "      return *this;\n    }\n";
        } else {
          o << "    " << name << "_Builder& set_" << f->name() << "(std::vector<" << k.ctype
            << "> v) {\n"
            << "      const auto& kept = store_.Keep(std::move(v));\n"
            << "      m_." << fn << " = " << MemberType(f) << "(kept.data(), kept.size());\n"
            << "      return *this;\n    }\n";
        }
      } else if (k.kind == "kString" || k.kind == "kBytes") {
        o << "    " << name << "_Builder& set_" << f->name() << "(std::string v) {\n"
          << "      const auto& kept = store_.Keep(std::move(v));\n"
          << "      m_." << fn << (IsOptional(f) ? " = " : " = ")
          << (k.kind == "kString" ? "std::string_view(kept)" : "::plexus::rpc::AsBytes(kept)")
          << ";\n      return *this;\n    }\n";
      } else if (k.kind == "kMessage") {
        o << "    // Shallow: `v`'s views must outlive the message.\n"
          << "    " << name << "_Builder& set_" << f->name() << "(const " << k.ctype << "& v) {\n"
          << "      m_." << fn << " = &store_.Keep(" << k.ctype << "(v));\n"
          << "      return *this;\n    }\n";
      } else {
        o << "    " << name << "_Builder& set_" << f->name() << "(" << k.ctype << " v) {\n"
          << "      m_." << fn << " = v;\n      return *this;\n    }\n";
      }
    }
    o << "    const " << name << "& message() const { return m_; }\n"
      << "   private:\n    " << name << " m_;\n    ::plexus::rpc::Storage store_;\n};\n\n";
  }

  static void DescriptorFn(const pb::Descriptor* m, std::ostringstream& o) {
    const std::string name = LocalName(m);
    o << "inline const ::plexus::rpc::MessageDesc& " << name << "::Descriptor() {\n"
      << "  using M = " << name << ";\n";
    if (m->field_count() > 0) {
      o << "  static const ::plexus::rpc::FieldDesc fields[] = {\n";
      for (int i = 0; i < m->field_count(); ++i) {
        const auto* f = m->field(i);
        Kind k = KindOf(f);
        const std::string fn = FieldName(f);
        const std::string label = f->is_repeated() ? "kRepeated"
                                  : IsOptional(f)  ? "kOptional"
                                                   : "kSingular";
        o << "      {\"" << f->name() << "\", " << f->number()
          << ", ::plexus::rpc::FieldKind::" << k.kind << ", ::plexus::rpc::FieldLabel::" << label
          << ",\n       ";
        if (k.kind == "kMessage") {
          o << "[]() -> const ::plexus::rpc::MessageDesc* { return &" << k.ctype
            << "::Descriptor(); }, ";
        } else {
          o << "nullptr, ";
        }
        if (k.kind == "kEnum") {
          o << "&" << Namespace(f->enum_type()->file()) << "::" << LocalName(f->enum_type())
            << "_Descriptor,\n       ";
        } else {
          o << "nullptr,\n       ";
        }
        const bool view =
            f->is_repeated() || k.kind == "kString" || k.kind == "kBytes" || k.kind == "kMessage";
        const std::string member = "static_cast<M*>(m)->" + fn + (IsOptional(f) ? ".value" : "");
        const std::string cmember =
            "static_cast<const M*>(m)->" + fn + (IsOptional(f) ? ".value" : "");
        if (!view) {
          o << "[](void* m) -> void* { return &" << member << "; },\n       ";
        } else {
          o << "nullptr,\n       ";
        }
        if (IsOptional(f)) {
          o << "[](void* m) -> bool* { return &static_cast<M*>(m)->" << fn << ".has; },\n       ";
        } else {
          o << "nullptr,\n       ";
        }
        if (!view) {
          o << "nullptr, nullptr},\n";
          continue;
        }
        if (f->is_repeated()) {
          o << "[](const void* m, const void** d, size_t* n) { "
               "::plexus::rpc::internal::GetSpan("
            << cmember << ", d, n); },\n       "
            << "[](void* m, const void* d, size_t n) { " << member << " = " << MemberType(f)
            << "(static_cast<const " << k.ctype << "*>(d), n); }},\n";
        } else if (k.kind == "kMessage") {
          o << "[](const void* m, const void** d, size_t* n) { *d = " << cmember
            << "; *n = *d ? 1 : 0; },\n       "
            << "[](void* m, const void* d, size_t) { " << member << " = static_cast<const "
            << k.ctype << "*>(d); }},\n";
        } else if (k.kind == "kString") {
          o << "[](const void* m, const void** d, size_t* n) { "
               "::plexus::rpc::internal::GetString("
            << cmember << ", d, n); },\n       "
            << "[](void* m, const void* d, size_t n) { " << member
            << " = ::plexus::rpc::internal::MakeString(d, n); }},\n";
        } else {
          o << "[](const void* m, const void** d, size_t* n) { "
               "::plexus::rpc::internal::GetSpan("
            << cmember << ", d, n); },\n       "
            << "[](void* m, const void* d, size_t n) { " << member
            << " = ::plexus::rpc::Bytes(static_cast<const uint8_t*>(d), n); }},\n";
        }
      }
      o << "  };\n";
    }
    o << "  static const ::plexus::rpc::MessageDesc desc{\"" << m->full_name()
      << "\", sizeof(M), alignof(M), [](void* p) { new (p) M(); }, "
      << (m->field_count() > 0 ? "fields" : "nullptr") << ", " << m->field_count() << "};\n"
      << "  return desc;\n}\n\n";
  }

  static void Service(const pb::ServiceDescriptor* s, std::ostringstream& o) {
    std::map<std::string, std::string> canon;
    std::string text = "service " + s->full_name() + "{";
    for (int i = 0; i < s->method_count(); ++i) {
      const auto* m = s->method(i);
      text += "rpc " + m->name() + "(" + m->input_type()->full_name() + ")->(" +
              m->output_type()->full_name() + ");";
      Canon(m->input_type(), &canon);
      Canon(m->output_type(), &canon);
    }
    text += "}";
    for (const auto& [name, t] : canon) text += t;
    const uint64_t hash = Fnv64(text);
    const uint64_t id64 = Fnv64(s->full_name());
    const uint32_t id = static_cast<uint32_t>(id64 ^ (id64 >> 32));
    const std::string name = s->name();
    o << "// service " << s->full_name() << "\nclass " << name << " {\n public:\n"
      << "  static constexpr uint64_t kSchemaHash = 0x" << std::hex << hash << std::dec
      << "ull;\n  static const ::plexus::rpc::ServiceDesc& Descriptor() {\n";
    o << "    static const ::plexus::rpc::MethodDesc methods[] = {\n";
    for (int i = 0; i < s->method_count(); ++i) {
      const auto* m = s->method(i);
      o << "        {\"" << m->name() << "\", " << i
        << ", []() -> const ::plexus::rpc::MessageDesc* { return &"
        << QualifiedName(m->input_type()) << "::Descriptor(); },\n"
        << "         []() -> const ::plexus::rpc::MessageDesc* { return &"
        << QualifiedName(m->output_type()) << "::Descriptor(); }, "
        << (m->options().idempotency_level() != pb::MethodOptions::IDEMPOTENCY_UNKNOWN ? "true"
                                                                                       : "false")
        << "},\n";
    }
    o << "    };\n    static const ::plexus::rpc::ServiceDesc desc{\"" << s->full_name() << "\", "
      << id << "u, kSchemaHash, methods, " << s->method_count() << "};\n    return desc;\n  }\n\n";
    // Stub.
    o << "  // Client stub; the channel's handshake must have named this service.\n"
      << "  class Stub {\n   public:\n"
      << "    explicit Stub(std::shared_ptr<::plexus::rpc::Channel> channel)"
         " : channel_(std::move(channel)) {}\n";
    for (int i = 0; i < s->method_count(); ++i) {
      const auto* m = s->method(i);
      const std::string req = QualifiedName(m->input_type());
      const std::string resp = QualifiedName(m->output_type());
      const std::string md = "Descriptor().methods[" + std::to_string(i) + "]";
      o << "    // " << m->name() << ": async (future form); `request` must outlive the call.\n"
        << "    ::plexus::rpc::PendingCall<" << resp << "> " << m->name() << "(const " << req
        << "& request, const ::plexus::rpc::CallOptions& options = {}) {\n"
        << "      return ::plexus::rpc::internal::StartTyped<" << resp
        << ">(*channel_, Descriptor(), " << md << ", &request, options);\n    }\n"
        << "    // Callback form: `done` runs on the channel's thread.\n"
        << "    void " << m->name() << "(const " << req
        << "& request, const ::plexus::rpc::CallOptions& options,\n"
        << "        std::function<void(absl::StatusOr<::plexus::rpc::Reply<" << resp
        << ">>)> done) {\n"
        << "      ::plexus::rpc::internal::StartTypedCallback<" << resp
        << ">(*channel_, Descriptor(), " << md << ", &request, options, std::move(done));\n"
        << "    }\n"
        << "    // Blocking.\n"
        << "    absl::StatusOr<::plexus::rpc::Reply<" << resp << ">> " << m->name() << "Sync(const "
        << req << "& request, const ::plexus::rpc::CallOptions& options = {}) {\n"
        << "      return " << m->name() << "(request, options).Get();\n    }\n";
    }
    o << "   private:\n    std::shared_ptr<::plexus::rpc::Channel> channel_;\n  };\n\n";
    // Service base.
    o << "  // Server base: override Method (synchronous: runs on a handler thread, or on the\n"
      << "  // dispatcher thread when registered as never blocking) or MethodAsync (runs on the\n"
      << "  // dispatcher thread and must return at once: finish later, from any thread).\n"
      << "  class Service : public ::plexus::rpc::ServiceBase {\n   public:\n"
      << "    const ::plexus::rpc::ServiceDesc& descriptor() const override { return "
         "Descriptor(); }\n";
    for (int i = 0; i < s->method_count(); ++i) {
      const auto* m = s->method(i);
      const std::string req = QualifiedName(m->input_type());
      const std::string resp = QualifiedName(m->output_type());
      o << "    virtual absl::Status " << m->name()
        << "(::plexus::rpc::ServerContext& context, const " << req << "& request, " << resp
        << "* response) {\n"
        << "      (void)context; (void)request; (void)response;\n"
        << "      return absl::UnimplementedError(\"" << m->full_name()
        << " is not implemented by this server\");\n    }\n"
        << "    virtual void " << m->name() << "Async(::plexus::rpc::ServerCall<" << req << ", "
        << resp << "> call) {\n"
        << "      ::plexus::rpc::internal::ServerCallAccess::state(call).RunSync(\n"
        << "          this, [](::plexus::rpc::ServiceBase* s, "
           "::plexus::rpc::internal::ServerCallState& c) {\n"
        << "            return static_cast<Service*>(s)->" << m->name()
        << "(c.context(), *static_cast<const " << req << "*>(c.request()), static_cast<" << resp
        << "*>(c.response()));\n"
        << "          });\n    }\n";
    }
    o << "    void Dispatch(uint32_t method_id, "
         "std::shared_ptr<::plexus::rpc::internal::ServerCallState> call) override {\n"
      << "      switch (method_id) {\n";
    for (int i = 0; i < s->method_count(); ++i) {
      const auto* m = s->method(i);
      o << "        case " << i << ": " << m->name() << "Async(::plexus::rpc::ServerCall<"
        << QualifiedName(m->input_type()) << ", " << QualifiedName(m->output_type())
        << ">(std::move(call))); return;\n";
    }
    o << "        default: call->Finish(absl::UnimplementedError(\"unknown method\"));\n"
      << "      }\n    }\n  };\n};\n\n";
  }
};

}  // namespace

int main(int argc, char* argv[]) {
  Generator generator;
  return pb::compiler::PluginMain(argc, argv, &generator);
}
