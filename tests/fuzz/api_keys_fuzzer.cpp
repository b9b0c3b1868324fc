// The api-keys file (server/api_keys.h): any bytes as the file; a key that
// loads must identify its own tenant and no other key.

#include "fuzz_target.h"
#include "pagoda/server/api_keys.h"

namespace pagoda::fuzz {

int fuzz_api_keys(const uint8_t* data, size_t size) {
  auto store = server::ApiKeyStore::parse(as_text(data, size), "fuzz.json");
  if (!store.ok()) return 0;
  if (!store->enabled()) fail("a loaded store without keys");
  for (const auto& tenant : store->tenants())
    if (tenant.empty()) fail("an empty tenant name");
  if (store->identify("Bearer ").has_value()) fail("an empty key matched");
  (void)store->tenant_limits();
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_api_keys)
