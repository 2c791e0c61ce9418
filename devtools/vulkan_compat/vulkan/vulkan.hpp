// Vulkan-Hpp as installed, plus the three VK_EXT_layer_settings types (Vulkan 1.3.272) that
// llama.cpp's Vulkan backend uses and older headers (Debian 12: 1.3.239) lack. Found before the
// system headers through -I (devtools/llama_wheel.py --vulkan); a no-op with newer headers.
#pragma once
#include_next <vulkan/vulkan.hpp>

#if VK_HEADER_VERSION < 272
#include <cstdint>
#include <vector>

namespace vk {

enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0,
    eInt32 = 1,
    eInt64 = 2,
    eUint32 = 3,
    eUint64 = 4,
    eFloat32 = 5,
    eFloat64 = 6,
    eString = 7,
};

// Same layout as VkLayerSettingEXT.
struct LayerSettingEXT {
    LayerSettingEXT(const char* layer = nullptr, const char* setting = nullptr,
                    LayerSettingTypeEXT kind = LayerSettingTypeEXT::eBool32, uint32_t count = 0,
                    const void* values = nullptr)
        : pLayerName(layer), pSettingName(setting), type(kind), valueCount(count), pValues(values) {}
    const char* pLayerName;
    const char* pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void* pValues;
};

// Same layout as VkLayerSettingsCreateInfoEXT (VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT).
struct LayerSettingsCreateInfoEXT {
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
    StructureType sType = static_cast<StructureType>(1000496000);
    const void* pNext = nullptr;
    uint32_t settingCount;
    const LayerSettingEXT* pSettings;
};

}  // namespace vk
#endif
