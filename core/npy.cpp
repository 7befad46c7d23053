#include "core/npy.hpp"

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace ulpgate {

// Tensors hold their words in host order; .npy files here are little-endian.
static_assert(std::endian::native == std::endian::little, "the .npy reader and writer assume a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::int64_t kMaxElements = std::int64_t{1} << 62;  // products stay exact in 64 bits
constexpr std::size_t kMaxDims = 64;                          // NumPy's NPY_MAXDIMS

// A byte of the header as a message shows it: 'x' if printable, else its value.
std::string show(char ch) {
  const auto u = static_cast<unsigned char>(ch);
  return u >= 0x20 && u < 0x7f ? fmt::format("'{}'", ch) : fmt::format("byte 0x{:02x}", u);
}

std::string show_shape(const std::vector<std::int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// The header dict, read as the Python literal NumPy writes: {'descr': '<f4',
// 'fortran_order': False, 'shape': (3, 4), } with spaces or tabs between tokens.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  void parse(NpyHeader& h) {
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_space();
    expect('{', "the header dict's '{'");
    skip_space();
    while (peek() != '}') {
      const std::string key = string_literal("a key");
      skip_space();
      expect(':', fmt::format("':' after key '{}'", key));
      skip_space();
      const auto once = [&](bool& seen) {
        if (seen) fail(fmt::format("key '{}' given twice", key));
        seen = true;
      };
      if (key == "descr") {
        once(seen_descr);
        if (peek() != '\'' && peek() != '"') fail("descr: must be a string such as '<f4' (structured dtypes are not read)");
        h.descr = string_literal("descr");
      } else if (key == "fortran_order") {
        once(seen_order);
        h.fortran_order = boolean();
      } else if (key == "shape") {
        once(seen_shape);
        h.shape = tuple();
      } else {
        fail(fmt::format("unexpected key '{}' (a .npy header holds descr, fortran_order and shape)", key));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail(fmt::format("expected ',' or '}}' at offset {}, found {}", pos_, show_at()));
      }
    }
    ++pos_;
    if (!seen_descr) fail("missing key 'descr'");
    if (!seen_order) fail("missing key 'fortran_order'");
    if (!seen_shape) fail("missing key 'shape'");
    skip_space();
    if (pos_ != text_.size()) fail(fmt::format("{} at offset {} after the dict", show_at(), pos_));
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw InputError(".npy header: " + what); }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  std::string show_at() const { return pos_ < text_.size() ? show(text_[pos_]) : "the end of the header"; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  void expect(char ch, const std::string& what) {
    if (peek() != ch || pos_ >= text_.size()) fail(fmt::format("expected {} at offset {}, found {}", what, pos_, show_at()));
    ++pos_;
  }

  // '...' or "...", printable ASCII without escapes (no key or dtype needs one).
  std::string string_literal(const std::string& what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(fmt::format("expected {} (a quoted string) at offset {}, found {}", what, pos_, show_at()));
    const std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      const auto u = static_cast<unsigned char>(text_[pos_]);
      if (u < 0x20 || u >= 0x7f || u == '\\')
        fail(fmt::format("{} at offset {} inside a string (printable ASCII without escapes only)", show(text_[pos_]), pos_));
      ++pos_;
    }
    if (pos_ >= text_.size()) fail(fmt::format("string at offset {} is not closed", start - 1));
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool boolean() {
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}})
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    fail(fmt::format("fortran_order: expected True or False at offset {}, found {}", pos_, show_at()));
  }

  std::int64_t integer() {
    const std::size_t start = pos_;
    std::int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (pos_ > start && v == 0) fail(fmt::format("shape: leading zero at offset {}", start));
      const int digit = text_[pos_++] - '0';
      if (v > (kMaxElements - digit) / 10) fail("shape: a dimension above 2^62");
      v = v * 10 + digit;
    }
    if (pos_ == start) fail(fmt::format("shape: expected a non-negative integer at offset {}, found {}", pos_, show_at()));
    return v;
  }

  // (), (n,), (n, m), (n, m,): Python tuples of non-negative integers.
  std::vector<std::int64_t> tuple() {
    if (peek() != '(') fail(fmt::format("shape: expected a tuple at offset {}, found {}", pos_, show_at()));
    ++pos_;
    std::vector<std::int64_t> dims;
    bool trailing_comma = false;
    skip_space();
    while (peek() != ')') {
      if (dims.size() == kMaxDims) fail(fmt::format("shape: more than {} dimensions", kMaxDims));
      dims.push_back(integer());
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        fail(fmt::format("shape: expected ',' or ')' at offset {}, found {}", pos_, show_at()));
      }
    }
    ++pos_;
    if (dims.size() == 1 && !trailing_comma)
      fail(fmt::format("shape: ({}) is not a tuple (one dimension is written ({},))", dims[0], dims[0]));
    return dims;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

std::uint32_t little_endian(std::string_view bytes, std::size_t at, int width) {
  std::uint32_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

}  // namespace

std::string_view npy_dtype(Format f) {
  switch (f) {
    case Format::FP64: return "<f8";
    case Format::FP32:
    case Format::TF32: return "<f4";
    case Format::FP16: return "<f2";
    case Format::BF16: return "<u2";
    case Format::E4M3:
    case Format::E5M2: return "|u1";
  }
  return "?";
}

NpyHeader parse_npy_header(std::string_view bytes) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic)
    throw InputError("not a .npy file (it does not start with \\x93NUMPY)");
  if (bytes.size() < 10) throw InputError(fmt::format(".npy file of {} bytes ends inside its preamble", bytes.size()));
  NpyHeader h;
  h.major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (h.major < 1 || h.major > 3 || minor != 0)
    throw InputError(fmt::format("unsupported .npy version {}.{} (1.0, 2.0 and 3.0 are read)", h.major, minor));
  const std::size_t preamble = h.major == 1 ? 10 : 12;
  if (bytes.size() < preamble) throw InputError(fmt::format(".npy file of {} bytes ends inside its preamble", bytes.size()));
  const std::uint64_t length = little_endian(bytes, 8, h.major == 1 ? 2 : 4);
  if (length > bytes.size() - preamble)
    throw InputError(fmt::format(".npy header length {} runs past the end of the file ({} bytes)", length, bytes.size()));
  const std::string_view text = bytes.substr(preamble, length);
  if (text.empty() || text.back() != '\n') throw InputError(".npy header: does not end with a newline");
  HeaderParser(text.substr(0, text.size() - 1)).parse(h);
  h.data_offset = preamble + length;
  for (const std::int64_t d : h.shape) {
    if (d != 0 && h.elements > kMaxElements / d) throw InputError(fmt::format(".npy header: shape {} holds more than 2^62 elements", show_shape(h.shape)));
    h.elements *= d;
  }
  return h;
}

Tensor tensor_from_npy(std::string_view bytes, Format f, std::int64_t elements) {
  const NpyHeader h = parse_npy_header(bytes);
  const std::string_view want = npy_dtype(f);
  if (h.descr != want) {
    if (!h.descr.empty() && h.descr[0] == '>')
      throw InputError(fmt::format("dtype '{}' is big-endian; {} is read as '{}'", h.descr, name(f), want));
    throw InputError(fmt::format("dtype '{}' is not {}'s '{}'{}", h.descr, name(f), want,
                                 f == Format::BF16 ? " (bf16 as uint16 words)" : is_fp8(f) ? " (fp8 as uint8 words)" : ""));
  }
  if (h.fortran_order) throw InputError("fortran_order is True (ulpgate reads C order only)");
  if (h.elements != elements)
    throw InputError(fmt::format("shape {} holds {} elements, expected {}", show_shape(h.shape), h.elements, elements));
  // elements may be up to 2^62 here (the fuzzer's calls): compared in whole words, no product overflows.
  const std::size_t width = storage_bytes(f), have = bytes.size() - h.data_offset;
  if (have / width < static_cast<std::uint64_t>(elements))
    throw InputError(fmt::format("truncated: {} data bytes hold {} of the {} elements of '{}'", have, have / width, elements, want));
  const std::size_t need = static_cast<std::size_t>(elements) * width;
  if (have > need) throw InputError(fmt::format("{} trailing bytes after the {} elements", have - need, elements));
  Tensor t(f, static_cast<std::size_t>(elements), Tensor::uninitialized);
  if (need) std::memcpy(t.data(), bytes.data() + h.data_offset, need);
  check_tf32_words(t);
  return t;
}

void check_tf32_words(const Tensor& t) {
  if (t.format() != Format::TF32) return;
  const auto* w = static_cast<const std::uint32_t*>(t.data());
  for (std::size_t i = 0; i < t.size(); ++i)
    if (w[i] & 0x1fffu) throw InputError(fmt::format("element {}: 0x{:08x} is not a TF32 word (low 13 bits not zero)", i, w[i]));
}

std::string npy_bytes(const Tensor& t) {
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({},), }}", npy_dtype(t.format()), t.size());
  // NumPy pads with spaces so that the data starts at a multiple of 64 bytes.
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(t.data()), t.size_bytes());
  return out;
}

Tensor read_npy_file(const std::string& path, Format f, std::int64_t elements) {
  const std::string bytes = read_whole_file(path, ".npy file");
  try {
    return tensor_from_npy(bytes, f, elements);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

void write_npy_file(const std::string& path, const Tensor& t) { write_text_file_atomically(path, npy_bytes(t)); }

}  // namespace ulpgate
