// The .npy reader and writer: every format's bits round trip, NumPy's own header layout,
// and each kind of malformed file refused with one line naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <unistd.h>

#include "core/error.hpp"
#include "core/npy.hpp"
#include "core/rng.hpp"
#include "tests/core/npy_samples.hpp"

using namespace ulpgate;
using samples::npy_file;

namespace {

// The InputError message of reading bytes as n words of f ("" when accepted).
std::string refusal(const std::string& bytes, Format f = Format::FP32, std::int64_t n = 3) {
  try {
    tensor_from_npy(bytes, f, n);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const std::string kThreeFloats(12, '\0');

}  // namespace

TEST(Npy, EveryFormatsBitsRoundTrip) {
  for (const Format f : kAllFormats) {
    // Every code of the 8- and 16-bit formats; 2^16 random codes (and the extremes) of the others.
    const int bits = info(f).bits;
    const std::size_t n = bits <= 16 ? std::size_t{1} << bits : 65536 + 2;
    Tensor t(f, n);
    const Code all_ones = bits == 64 ? ~Code{0} : (Code{1} << bits) - 1;
    for (std::size_t i = 0; i < n; ++i) {
      Code c = i;
      if (bits > 16) c = i < 65536 ? low64(random_block(1234, static_cast<std::uint32_t>(f), i)) & all_ones
                                   : i == 65536 ? 0 : all_ones;
      t.set_code(i, c);
    }
    const std::string bytes = npy_bytes(t);
    const Tensor back = tensor_from_npy(bytes, f, static_cast<std::int64_t>(n));
    ASSERT_EQ(back.size_bytes(), t.size_bytes()) << name(f);
    EXPECT_EQ(std::memcmp(back.data(), t.data(), t.size_bytes()), 0) << name(f);
    const NpyHeader h = parse_npy_header(bytes);
    EXPECT_EQ(h.descr, npy_dtype(f));
    EXPECT_EQ(h.data_offset % 64, 0u) << "data aligned as NumPy aligns it";
  }
  const std::string path = testing::TempDir() + "ulpgate_npy_" + std::to_string(::getpid()) + ".npy";
  Tensor t(Format::BF16, 5);
  t.set_value(3, -2.5);
  write_npy_file(path, t);
  const Tensor back = read_npy_file(path, Format::BF16, 5);
  EXPECT_EQ(back.value(3), -2.5);
  try {
    read_npy_file(path, Format::BF16, 6);
    ADD_FAILURE() << "a file of 5 elements read as 6";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": shape (5,) holds 5 elements, expected 6", 0), 0u) << e.what();
  }
  ::unlink(path.c_str());
}

// What np.save(f, np.zeros(3, np.float32)) writes: version 1.0, the header padded with
// spaces so that the data starts at byte 128.
TEST(Npy, HeaderIsLaidOutAsNumPyLaysItOut) {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  std::string numpy = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + std::string(117 - dict.size(), ' ') + "\n";
  numpy += kThreeFloats;
  EXPECT_EQ(npy_bytes(Tensor(Format::FP32, 3)), numpy);
}

TEST(Npy, OtherVersionsAndSpellingsAreRead) {
  const std::string words(12, '\x3c');
  const Tensor t = tensor_from_npy(npy_file(2, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", words),
                                   Format::FP16, 6);
  EXPECT_EQ(t.code(5), 0x3c3cu);
  EXPECT_EQ(refusal(npy_file(3, "{\"shape\": (), \"descr\": \"<u2\", \"fortran_order\": False}", words.substr(0, 2)),
                    Format::BF16, 1), "");
  EXPECT_EQ(refusal(npy_file(1, "{ 'descr':'|u1' ,\t'fortran_order' : False,'shape':(1,3,) }", words.substr(0, 3)),
                    Format::E4M3, 3), "");
  EXPECT_EQ(refusal(npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", ""), Format::FP32, 0), "");
}

TEST(Npy, MalformedFilesAreRefusedWithOneLineNamingTheProblem) {
  const auto v1 = [](const std::string& dict, const std::string& data = kThreeFloats) { return npy_file(1, dict, data); };
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  ASSERT_EQ(refusal(v1(good)), "");
  std::string long_header = v1(good);
  long_header[8] = '\xff', long_header[9] = '\xff';
  std::string v2_long = npy_file(2, good, kThreeFloats);
  v2_long.replace(8, 4, "\xff\xff\xff\xff");
  std::string no_newline = v1(good);
  no_newline[no_newline.size() - kThreeFloats.size() - 1] = ' ';
  std::string tf32(kThreeFloats);
  tf32[4] = '\x01';
  const struct {
    std::string bytes;
    std::string message;
    Format f = Format::FP32;
    std::int64_t n = 3;
  } cases[] = {
      {"GIF89a" + kThreeFloats, "not a .npy file (it does not start with \\x93NUMPY)"},
      {std::string("\x93NUMPY\x01", 7), ".npy file of 7 bytes ends inside its preamble"},
      {std::string("\x93NUMPY\x04\x00", 8) + v1(good).substr(8), "unsupported .npy version 4.0 (1.0, 2.0 and 3.0 are read)"},
      {std::string("\x93NUMPY\x01\x01", 8) + v1(good).substr(8), "unsupported .npy version 1.1"},
      {long_header, ".npy header length 65535 runs past the end of the file (140 bytes)"},
      {v2_long, ".npy header length 4294967295 runs past the end of the file (140 bytes)"},
      {no_newline, ".npy header: does not end with a newline"},
      {v1("['descr', '<f4']"), ".npy header: expected the header dict's '{' at offset 0, found '['"},
      {v1("{'descr': '<f4', 'shape': (3,), }"), ".npy header: missing key 'fortran_order'"},
      {v1("{'descr': '<f4', 'fortran_order': False, }"), ".npy header: missing key 'shape'"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}"),
       ".npy header: unexpected key 'x' (a .npy header holds descr, fortran_order and shape)"},
      {v1("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}"), ".npy header: key 'descr' given twice"},
      {v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}"), ".npy header: descr: must be a string"},
      {v1("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}"), ".npy header: fortran_order: expected True or False"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3)}"),
       ".npy header: shape: (3) is not a tuple (one dimension is written (3,))"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}"), ".npy header: shape: expected a non-negative integer"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (03,)}"), ".npy header: shape: leading zero"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"),
       ".npy header: shape: a dimension above 2^62"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4)}"),
       ".npy header: shape (4611686018427387904, 4) holds more than 2^62 elements"},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} x"), ".npy header: 'x' at offset 56 after the dict"},
      {v1(std::string("{'descr': '<f\0', 'fortran_order': False, 'shape': (3,)}", 55)),
       ".npy header: byte 0x00 at offset 13 inside a string"},
      {v1("{'descr': '<f4, 'fortran_order': False, 'shape': (3,)}"), ".npy header: expected ',' or '}' at offset 17"},
      {v1("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }"), "fortran_order is True (ulpgate reads C order only)"},
      {v1("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }"), "dtype '>f4' is big-endian; fp32 is read as '<f4'"},
      {v1("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }"), "dtype '<f8' is not fp32's '<f4'"},
      {v1("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", kThreeFloats.substr(0, 6)),
       "dtype '<f2' is not bf16's '<u2' (bf16 as uint16 words)", Format::BF16},
      {v1("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", kThreeFloats.substr(0, 3)),
       "dtype '<u2' is not e5m2's '|u1' (fp8 as uint8 words)", Format::E5M2},
      {v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }"), "shape (2, 2) holds 4 elements, expected 3"},
      {v1(good, kThreeFloats.substr(0, 8)), "truncated: 8 data bytes hold 2 of the 3 elements of '<f4'"},
      {v1(good, kThreeFloats + "abcd"), "4 trailing bytes after the 3 elements"},
      {v1("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }"),
       "truncated: 12 data bytes hold 1 of the 4611686018427387904 elements of '<f8'", Format::FP64, std::int64_t{1} << 62},
      {v1(good, tf32), "element 1: 0x00000001 is not a TF32 word (low 13 bits not zero)", Format::TF32},
  };
  for (const auto& c : cases) {
    const std::string why = refusal(c.bytes, c.f, c.n);
    EXPECT_EQ(why.rfind(c.message, 0), 0u) << "got:      " << why << "\nexpected: " << c.message;
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  }
}
