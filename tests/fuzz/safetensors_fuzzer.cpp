// The safetensors header parser (model/safetensors_file.h): any bytes as a
// .safetensors file. Every tensor of a file that opens must lie inside it.

#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "fuzz_target.h"
#include "pagoda/model/safetensors_file.h"

namespace pagoda::fuzz {

int fuzz_safetensors(const uint8_t* data, size_t size) {
  // An in-memory file: open() maps a path.
  const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  auto file = SafetensorsFile::open("/proc/self/fd/" + std::to_string(fd));
  if (file.ok()) {
    for (const TensorInfo& t : file->tensors()) {
      if (t.num_bytes * 8 != static_cast<size_t>(t.num_elements()) * static_cast<size_t>(dtype_bits(t.dtype)))
        fail("tensor bytes disagree with its shape");
      if (t.num_bytes > size) fail("a tensor larger than the file");
      // Touch the first and last byte: they must be inside the mapping.
      if (t.num_bytes > 0) {
        volatile uint8_t first = static_cast<const uint8_t*>(t.data)[0];
        volatile uint8_t last = static_cast<const uint8_t*>(t.data)[t.num_bytes - 1];
        (void)first;
        (void)last;
      }
    }
  }
  close(fd);
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_safetensors)
